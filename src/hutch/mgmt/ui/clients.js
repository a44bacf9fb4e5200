// #/connections and #/channels: who is connected, their state (flow control and alarms show as
// flow / blocking / blocked), traffic and settings; an administrator can close a connection.
// #/connections/{name} (settings, TLS, client properties, data rates, channels) and #/channels/{name}
// (settings, unacked / unconfirmed counts, message rates, consumers, publishes per exchange).

import {DELETE, GET, hasTag, p} from './api.js';
import {History, LineChart} from './chart.js';
import {channelHref, connectionHref, exchangeHref, exchangeLabel, keyValues, queueHref} from './common.js';
import {badge, confirmDialog, facts, fill, h, link, section, toast} from './dom.js';
import {bytes, byteRate, dateTime, get, num, rate, statRate} from './fmt.js';
import {RATE_SERIES, RateTracker, withCounterRates} from './series.js';
import {clientList, DataTable, vhostList} from './table.js';

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
export function traffic(c, which) {
  const r = get(c, `${which}_oct_details.rate`);
  return [typeof r === 'number' ? byteRate(r) : '—', h('div', {class: 'muted small'}, bytes(c[which + '_oct']) + ' total')];
}

/** Ask, then close connection `name` (administrators); true when it was closed. */
async function closeConnection(name) {
  if (!(await confirmDialog(`Close connection ${name}? The client gets 320 CONNECTION_FORCED.`, 'Close connection'))) {
    return false;
  }
  try {
    await DELETE(p`/api/connections/${name}`);
    toast('Connection closed.');
    return true;
  } catch (exc) {
    toast(exc.describe(), 'error');
    return false;
  }
}

export function connectionsPage(ctx) {
  const vhost = ctx.vhost;
  const close = async (c) => {
    await closeConnection(c.name);
    table.refresh();
  };
  const admin = hasTag('administrator');
  const table = new DataTable({
    noun: 'connection', sort: 'name',
    load: withCounterRates(vhostList('/api/connections', vhost), (c) => c.name, ['recv_oct', 'send_oct']),
    columns: [
      {label: 'Name', key: 'name', render: (c) => [link(connectionHref(c.name), c.name),
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
    columns: channelColumns(!vhost, true),
  });
  return {title: 'Channels', nav: 'channels', el: table.el, refresh: () => table.refresh(), vhostScoped: true};
}

// -- one connection ---------------------------------------------------------------------------------

const DATA_SERIES = [{key: 'recv_oct', label: 'From client'}, {key: 'send_oct', label: 'To client', dash: [6, 3]}];

/** RabbitMQ's connection page's TLS facts, in its order and names, the values in its spelling (the API's:
 * tlsv1.3; any or ecdhe_rsa; aes_256_gcm; aead or sha384). */
function tls(c) {
  if (!c.ssl) return facts([['TLS', 'no: plain TCP']]);
  return facts([
    ['TLS', 'yes'],
    ['Protocol version', c.ssl_protocol],
    ['Key exchange algorithm', c.ssl_key_exchange],
    ['Cipher algorithm', c.ssl_cipher],
    ['Hash algorithm', c.ssl_hash],
    ['Peer certificate', c.peer_cert_subject ? [c.peer_cert_subject, h('div', {class: 'muted small'},
      `issued by ${c.peer_cert_issuer || '?'}, valid ${c.peer_cert_validity || '?'}`)] : undefined],
  ]);
}

/** The columns of a list of channels: every channel's, or one connection's. */
function channelColumns(withVhost, withUser) {
  return [
    {label: 'Channel', key: 'name', nowrap: true, render: (ch) => link(channelHref(ch.name), ch.name)},
    ...(withVhost ? [{label: 'Virtual host', key: 'vhost'}] : []),
    ...(withUser ? [{label: 'User', key: 'user'}] : []),
    {label: 'Mode', sort: false, render: mode, title: 'C: confirm mode, T: transactional'},
    {label: 'State', key: 'state', render: (ch) => stateBadge(ch.state)},
    {label: 'Prefetch', key: 'prefetch_count', render: prefetch},
    {label: 'Unacked', key: 'messages_unacknowledged', num: true},
    {label: 'Unconfirmed', key: 'messages_unconfirmed', num: true},
    {label: 'Consumers', key: 'consumer_count', num: true},
    {label: 'Publish', key: 'message_stats.publish_details.rate', num: true, render: (ch) => rate(statRate(ch, 'publish'))},
    {label: 'Deliver / get', key: 'message_stats.deliver_get_details.rate', num: true,
      render: (ch) => rate(statRate(ch, 'deliver_get'))},
    {label: 'Ack', key: 'message_stats.ack_details.rate', num: true, render: (ch) => rate(statRate(ch, 'ack'))},
  ];
}

export function connectionPage(ctx, [name]) {
  const history = new History();
  const tracker = new RateTracker(['recv_oct', 'send_oct']);
  const chart = new LineChart({title: 'Data rates', series: DATA_SERIES, kind: 'bytes', history});
  const summary = h('div', {}, 'Loading…');
  const security = h('div');
  const props = h('div');
  const channels = new DataTable({noun: 'channel', filter: false, sort: 'name', columns: channelColumns(false, false),
    load: clientList(() => GET(p`/api/connections/${name}/channels`))});
  const admin = hasTag('administrator');
  const el = h('div', {},
    h('div', {class: 'queue-top'}, section('Details', summary), chart.el, section('TLS', security)),
    section('Channels', channels.el),
    section('Client properties', props),
    admin ? section('Close', h('button', {type: 'button', class: 'danger', onclick: async () => {
      if (await closeConnection(name)) location.hash = '#/connections';
    }}, 'Close this connection')) : null);

  async function refresh() {
    const c = await GET(p`/api/connections/${name}`);
    const now = Date.now();
    history.push(now, tracker.rates(c, now));
    chart.draw();
    const cp = c.client_properties || {};
    fill(summary, facts([
      ['Name given by the client', c.user_provided_name || undefined],
      ['Virtual host', c.vhost],
      ['User', c.user],
      ['State', stateBadge(c.state)],
      ['Client', client(c)],
      ['Protocol', c.protocol],
      ['Authentication', c.auth_mechanism],
      ['Peer', `${c.peer_host}:${c.peer_port}`],
      ['Heartbeat', c.timeout ? `${c.timeout} s` : 'off'],
      ['Frame max', c.frame_max !== undefined ? `${num(c.frame_max)} bytes` : undefined],
      ['Channel max', c.channel_max !== undefined ? num(c.channel_max) : undefined],
      ['Traffic', `${bytes(c.recv_oct)} from the client, ${bytes(c.send_oct)} to it`],
      ['Node', c.node],
      ['Connected', dateTime(c.connected_at)],
    ]));
    fill(security, tls(c));
    const {capabilities, ...rest} = cp;
    fill(props, facts([...Object.entries(rest).map(([k, v]) => [k, typeof v === 'object' ? keyValues(v) : String(v)]),
      ['capabilities', capabilities ? keyValues(capabilities) : undefined]]));
    await channels.refresh();
  }
  return {title: `Connection ${name}`, nav: 'connections', el, refresh, crumbs: [['Connections', '#/connections']],
    destroy() { chart.destroy(); }};
}

// -- one channel ------------------------------------------------------------------------------------

export function channelPage(ctx, [name]) {
  const history = new History();
  const tracker = new RateTracker(RATE_SERIES.map((s) => s.key));
  const chart = new LineChart({title: 'Message rates', series: RATE_SERIES, kind: 'rate', history});
  const summary = h('div', {}, 'Loading…');
  let latest = {consumer_details: [], publishes: []};
  const consumers = new DataTable({noun: 'consumer', filter: false, sort: 'consumer_tag',
    load: clientList(async () => latest.consumer_details || []),
    columns: [
      {label: 'Consumer tag', key: 'consumer_tag'},
      {label: 'Queue', key: 'queue.name', render: (c) => link(queueHref(c.queue.vhost, c.queue.name), c.queue.name)},
      {label: 'Ack required', key: 'ack_required', render: (c) => (c.ack_required ? 'yes' : 'no')},
      {label: 'Exclusive', key: 'exclusive', render: (c) => (c.exclusive ? 'yes' : 'no')},
      {label: 'Prefetch', key: 'prefetch_count', num: true},
      {label: 'Priority', key: 'priority', num: true},
      {label: 'Active', key: 'active', render: (c) => (c.active === false ? badge('waiting', 'muted') : badge('active', 'ok'))},
    ]});
  const publishes = new DataTable({noun: 'exchange', filter: false, empty: 'Nothing published on this channel yet.',
    load: clientList(async () => (latest.publishes || []).map((x) => ({...x, exchangeName: x.exchange.name}))),
    columns: [
      {label: 'Exchange', key: 'exchangeName', render: (x) => link(exchangeHref(x.exchange.vhost, x.exchange.name),
        exchangeLabel(x.exchange.name))},
      {label: 'Published', key: 'stats.publish', num: true},
      {label: 'Rate', key: 'stats.publish_details.rate', num: true, render: (x) => rate(get(x, 'stats.publish_details.rate'))},
    ]});
  const el = h('div', {},
    h('div', {class: 'queue-top'}, section('Details', summary), chart.el),
    section('Consumers', consumers.el),
    section('Publishes by exchange', publishes.el));

  async function refresh() {
    const ch = await GET(p`/api/channels/${name}`);
    latest = ch;
    const now = Date.now();
    history.push(now, tracker.rates(ch.message_stats, now));
    chart.draw();
    const conn = ch.connection_details || {};
    fill(summary, facts([
      ['Connection', conn.name ? link(connectionHref(conn.name), conn.name) : undefined],
      ['Virtual host', ch.vhost],
      ['User', ch.user],
      ['Number', num(ch.number)],
      ['Mode', mode(ch)],
      ['State', stateBadge(ch.state)],
      ['Prefetch', prefetch(ch)],
      ['Unacknowledged', num(ch.messages_unacknowledged)],
      ['Unconfirmed', ch.confirm ? num(ch.messages_unconfirmed) : 'not in confirm mode'],
      ['Uncommitted', ch.transactional ? num(ch.messages_uncommitted) : undefined],
      ['Consumers', num(ch.consumer_count)],
      ['Node', ch.node],
    ]));
    await Promise.all([consumers.refresh(), publishes.refresh()]);
  }
  return {title: `Channel ${name}`, nav: 'channels', el, refresh, crumbs: [['Channels', '#/channels']],
    destroy() { chart.destroy(); }};
}
