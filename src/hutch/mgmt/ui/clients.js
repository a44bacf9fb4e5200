// #/connections and #/channels: who is connected, their state (flow control and alarms show as
// flow / blocking / blocked), traffic and settings; an administrator can close a connection.

import {DELETE, hasTag, p} from './api.js';
import {badge, confirmDialog, h, toast} from './dom.js';
import {bytes, dateTime, get, num, rate, statRate} from './fmt.js';
import {withCounterRates} from './series.js';
import {DataTable, vhostList} from './table.js';

const STATE_HELP = {
  running: 'running normally',
  flow: 'publishing is being throttled by flow control',
  blocking: 'a resource alarm is in effect: the connection will be blocked when it publishes',
  blocked: 'blocked by a resource alarm: publishes wait until it clears',
  idle: 'no recent activity',
  closing: 'closing',
  starting: 'still opening',
};

export function stateBadge(state) {
  const s = state || 'unknown';
  const kind = s === 'running' ? 'ok' : s === 'flow' ? 'warn' : s === 'blocked' || s === 'blocking' ? 'bad' : 'muted';
  return badge(s, kind, STATE_HELP[s]);
}

function client(c) {
  const props = c.client_properties || {};
  const product = [props.product, props.version].filter(Boolean).join(' ');
  const platform = props.platform ? h('span', {class: 'muted'}, ` (${props.platform})`) : null;
  return product ? [product, platform] : h('span', {class: 'muted'}, 'unknown');
}

/** Bytes per second (once known) over the total since the connection opened. */
function traffic(c, which) {
  const r = get(c, `${which}_oct_details.rate`);
  return [typeof r === 'number' ? bytes(r) + '/s' : '—', h('div', {class: 'muted small'}, bytes(c[which + '_oct']) + ' total')];
}

export function connectionsPage(ctx) {
  const vhost = ctx.vhost;
  const close = async (c) => {
    if (!(await confirmDialog(`Close connection ${c.name}? The client gets 320 CONNECTION_FORCED.`, 'Close connection'))) return;
    try {
      await DELETE(p`/api/connections/${c.name}`);
      toast('Connection closed.');
    } catch (exc) {
      toast(exc.describe(), 'error');
    }
    table.refresh();
  };
  const admin = hasTag('administrator');
  const table = new DataTable({
    noun: 'connection', sort: 'name',
    load: withCounterRates(vhostList('/api/connections', vhost), (c) => c.name, ['recv_oct', 'send_oct']),
    columns: [
      {label: 'Name', key: 'name', render: (c) => [c.name,
        c.user_provided_name ? h('div', {class: 'muted small'}, c.user_provided_name) : null]},
      ...(vhost ? [] : [{label: 'Virtual host', key: 'vhost'}]),
      {label: 'User', key: 'user'},
      {label: 'State', key: 'state', render: (c) => stateBadge(c.state)},
      {label: 'Client', key: 'client_properties.product', render: client},
      {label: 'Protocol', key: 'protocol', nowrap: true},
      {label: 'Channels', key: 'channels', num: true},
      {label: 'Heartbeat', key: 'timeout', num: true, render: (c) => (c.timeout ? `${c.timeout} s` : 'off')},
      {label: 'From client', key: 'recv_oct', num: true, render: (c) => traffic(c, 'recv')},
      {label: 'To client', key: 'send_oct', num: true, render: (c) => traffic(c, 'send')},
      {label: 'Connected', key: 'connected_at', nowrap: true, render: (c) => dateTime(c.connected_at)},
      ...(admin ? [{label: 'Action', sort: false, render: (c) =>
        h('button', {type: 'button', class: 'secondary small', onclick: () => close(c)}, 'Close')}] : []),
    ],
  });
  return {title: 'Connections', nav: 'connections', el: table.el, refresh: () => table.refresh(), vhostScoped: true};
}

function mode(ch) {
  const out = [];
  if (ch.confirm) out.push(badge('C', 'info', 'confirm mode: publishes are confirmed'));
  if (ch.transactional) out.push(badge('T', 'info', 'transactional'));
  return out.length ? out : h('span', {class: 'muted'}, '—');
}

function prefetch(ch) {
  const parts = [];
  if (ch.prefetch_count) parts.push(`${num(ch.prefetch_count)} per consumer`);
  if (ch.global_prefetch_count) parts.push(`${num(ch.global_prefetch_count)} per channel`);
  return parts.length ? parts.join(', ') : 'unlimited';
}

export function channelsPage(ctx) {
  const vhost = ctx.vhost;
  const table = new DataTable({
    noun: 'channel', sort: 'name',
    load: withCounterRates(vhostList('/api/channels', vhost), (ch) => ch.name,
      ['message_stats.publish', 'message_stats.deliver_get', 'message_stats.ack']),
    columns: [
      {label: 'Channel', key: 'name', nowrap: true},
      ...(vhost ? [] : [{label: 'Virtual host', key: 'vhost'}]),
      {label: 'User', key: 'user'},
      {label: 'Mode', sort: false, render: mode, title: 'C: confirm mode, T: transactional'},
      {label: 'State', key: 'state', render: (ch) => stateBadge(ch.state)},
      {label: 'Prefetch', key: 'prefetch_count', render: prefetch},
      {label: 'Unacked', key: 'messages_unacknowledged', num: true},
      {label: 'Consumers', key: 'consumer_count', num: true},
      {label: 'Publish', key: 'message_stats.publish_details.rate', num: true,
        render: (ch) => rate(statRate(ch, 'publish'))},
      {label: 'Deliver / get', key: 'message_stats.deliver_get_details.rate', num: true,
        render: (ch) => rate(statRate(ch, 'deliver_get'))},
      {label: 'Ack', key: 'message_stats.ack_details.rate', num: true, render: (ch) => rate(statRate(ch, 'ack'))},
    ],
  });
  return {title: 'Channels', nav: 'channels', el: table.el, refresh: () => table.refresh(), vhostScoped: true};
}
