// #/streams (the streams: where they run, their offsets, segments, size, consumers and publishers),
// #/streams/{vhost}/{name} (one stream: every consumer with its offset, lag and credit, AMQP 0-9-1 and
// stream protocol alike, and its publishers), #/stream-connections (the stream protocol's connections)
// and #/stream-connections/{vhost}/{name} (one, with its publishers and consumers; close it). The data is
// the stream routes of the API (mgmt/stream_routes.py, docs/streams.md); leader and members are what each
// stream reports.

import {DELETE, GET, hasTag, p, session} from './api.js';
import {channelHref, queueHref} from './common.js';
import {badge, confirmDialog, facts, fill, h, link, section, toast} from './dom.js';
import {bytes, dateTime, num} from './fmt.js';
import {clientList, DataTable, serverList} from './table.js';

export const streamHref = (vhost, name) => `#/streams/${encodeURIComponent(vhost)}/${encodeURIComponent(name)}`;
export const streamConnectionHref = (vhost, name) =>
  `#/stream-connections/${encodeURIComponent(vhost)}/${encodeURIComponent(name)}`;

/** The server-side list at `path`, or at `path/{vhost}` while the page is scoped to one virtual host. */
const scopedList = (path, vhost) => serverList(vhost ? `${path}/${encodeURIComponent(vhost)}` : path);

const TABS = [['streams', 'Streams', '#/streams'], ['connections', 'Stream connections', '#/stream-connections']];

function tabs(current) {
  return h('nav', {class: 'tabs', 'aria-label': 'Streams'}, TABS.map(([key, label, href]) =>
    h('a', {href, 'aria-current': key === current ? 'page' : null}, label)));
}

/** Leader, and the other members as "+N" (the full list on hover). */
function placement(s) {
  const members = Array.isArray(s.members) ? s.members : [];
  const others = members.filter((m) => m !== s.leader);
  return h('span', {title: members.length ? 'Members: ' + members.join(', ') : null}, s.leader || s.node || '—',
    others.length ? h('span', {class: 'muted'}, ` +${others.length}`) : null);
}

function offsets(s) {
  return h('span', {class: 'nowrap', title: 'first / committed / last offset'},
    `${num(s.first_offset)} / ${num(s.committed_offset)} / ${num(s.last_offset)}`);
}

const lag = (n) => (n === null || n === undefined ? '—' : n ? badge(num(n), 'warn', 'committed offsets not yet read') : badge('0', 'ok', 'caught up'));

// -- the list ---------------------------------------------------------------------------------------

export function streamsPage(ctx) {
  const vhost = ctx.vhost;
  const table = new DataTable({
    noun: 'stream', sort: 'name', label: 'Streams',
    load: scopedList('/api/stream/streams', vhost),
    columns: [
      ...(vhost ? [] : [{label: 'Virtual host', key: 'vhost'}]),
      {label: 'Name', key: 'name', render: (s) => link(streamHref(s.vhost, s.name), s.name)},
      {label: 'Leader', key: 'leader', render: placement, title: 'the member that writes (+ the other members)'},
      {label: 'Offsets', key: 'last_offset', num: true, render: offsets, title: 'first / committed / last offset'},
      {label: 'Messages', key: 'messages', num: true, title: 'offsets from the first to the last committed'},
      {label: 'Segments', key: 'segments', num: true},
      {label: 'Size', key: 'message_bytes', num: true, render: (s) => bytes(s.message_bytes)},
      {label: 'AMQP consumers', key: 'consumers', num: true},
      {label: 'Stream consumers', key: 'stream_consumers', num: true, title: 'stream-protocol subscriptions'},
      {label: 'Publishers', key: 'stream_publishers', num: true, title: 'stream-protocol publishers'},
    ],
  });
  const el = h('div', {}, tabs('streams'), table.el,
    h('p', {class: 'hint'}, 'A stream is a log: consumers read it from any offset and nothing is removed when they ' +
      'acknowledge; retention removes whole segments. Declare one as a queue of type Stream (Queues page).'));
  return {title: 'Streams', nav: 'streams', el, refresh: () => table.refresh(), vhostScoped: true};
}

// -- one stream -------------------------------------------------------------------------------------

/** AMQP 0-9-1 consumers (the queue's consumer_details) and stream-protocol subscriptions, as one list. */
function consumerRows(queue, subscriptions) {
  const amqp = (queue.consumer_details || []).map((c) => ({
    protocol: 'AMQP 0-9-1', id: c.consumer_tag, offset: c.offset, offset_lag: c.offset_lag, credits: c.credits,
    via: link(channelHref(c.channel_details.name), c.channel_details.name), consumed: undefined,
    active: c.active !== false, name: c.consumer_tag,
  }));
  const stream = subscriptions.map((s) => ({
    protocol: 'stream', id: `subscription ${s.subscription_id}`, offset: s.offset, offset_lag: s.offset_lag,
    credits: s.credits, consumed: s.messages_consumed, active: s.active,
    via: link(streamConnectionHref(s.connection_details.vhost, s.connection_details.name), s.connection_details.name),
    name: (s.properties && s.properties.name) || '',
  }));
  return [...amqp, ...stream];
}

const CONSUMER_COLUMNS = [
  {label: 'Consumer', key: 'id'},
  {label: 'Protocol', key: 'protocol'},
  {label: 'On', sort: false, render: (c) => c.via, title: 'the channel (AMQP 0-9-1) or the stream connection'},
  {label: 'Offset', key: 'offset', num: true, title: 'the next offset it gets'},
  {label: 'Lag', key: 'offset_lag', num: true, render: (c) => lag(c.offset_lag), title: 'committed offsets past its offset'},
  {label: 'Credit', key: 'credits', num: true,
    title: 'AMQP 0-9-1: its prefetch less its unacknowledged deliveries; stream protocol: chunks it may still be sent'},
  {label: 'Consumed', key: 'consumed', num: true, title: 'messages sent to it (stream protocol)'},
  {label: 'Active', key: 'active', render: (c) => (c.active ? badge('active', 'ok') : badge('waiting', 'muted',
    'a single active consumer waiting for its turn'))},
];

function publisherColumns(withConnection) {
  return [
    {label: 'Publisher', key: 'publisher_id', num: true},
    ...(withConnection ? [{label: 'Connection', key: 'connection_details.name', render: (x) =>
      link(streamConnectionHref(x.connection_details.vhost, x.connection_details.name), x.connection_details.name)}]
      : [{label: 'Stream', key: 'stream', render: (x) => link(streamHref(x.queue.vhost, x.stream), x.stream)}]),
    {label: 'Reference', key: 'reference', render: (x) => x.reference || h('span', {class: 'muted'}, 'none')},
    {label: 'Published', key: 'messages_published', num: true},
    {label: 'Confirmed', key: 'messages_confirmed', num: true},
    {label: 'Errored', key: 'messages_errored', num: true},
  ];
}

export function streamPage(ctx, [vhost, name]) {
  const summary = h('div', {class: 'summary'}, 'Loading…');
  let rows = [];
  let publishers = [];
  const consumers = new DataTable({noun: 'consumer', filter: false, sort: 'offset', label: 'Consumers',
    empty: 'Nobody reads this stream.', load: clientList(async () => rows, ['id']), columns: CONSUMER_COLUMNS});
  const pubs = new DataTable({noun: 'publisher', filter: false, label: 'Publishers',
    empty: 'No stream-protocol publisher writes to this stream (AMQP 0-9-1 publishes go through exchanges).',
    load: clientList(async () => publishers, ['reference']), columns: publisherColumns(true)});
  const el = h('div', {class: 'queue'},
    section('Details', summary),
    section('Consumers', consumers.el),
    section('Publishers', pubs.el));

  async function refresh() {
    const [q, subs, pubList] = await Promise.all([GET(p`/api/queues/${vhost}/${name}`),
      GET(p`/api/stream/consumers/${vhost}`), GET(p`/api/stream/publishers/${vhost}/${name}`)]);
    rows = consumerRows(q, subs.filter((s) => s.stream === name));
    publishers = pubList;
    const members = Array.isArray(q.members) ? q.members : [];
    fill(summary, facts([
      ['Virtual host', q.vhost],
      ['Leader', q.leader || q.node],
      ['Members', h('ul', {class: 'kvs'}, members.map((m) => h('li', {}, m,
        Array.isArray(q.online) && !q.online.includes(m) ? [' ', badge('offline', 'bad')] : null)))],
      ['First offset', num(q.first_offset)],
      ['Committed offset', num(q.committed_offset)],
      ['Last offset', num(q.last_offset)],
      ['Messages', `${num(q.messages)} (offsets from the first to the last committed)`],
      ['Segments', num(q.segments)],
      ['Size', bytes(q.message_bytes)],
      ['Retention', [q.arguments['x-max-age'] ? `max age ${q.arguments['x-max-age']}` : null,
        q.arguments['x-max-length-bytes'] ? `max ${bytes(q.arguments['x-max-length-bytes'])}` : null]
        .filter(Boolean).join(', ') || 'none (or from its policy)'],
      ['Policy', q.policy || '—'],
      ['As a queue', link(queueHref(vhost, name), 'queue page (bindings, publish, delete)')],
    ]));
    await Promise.all([consumers.refresh(), pubs.refresh()]);
  }
  return {title: `Stream ${name}`, nav: 'streams', el, refresh,
    crumbs: [['Streams', '#/streams'], [`virtual host ${vhost}`, null]]};
}

// -- stream connections -----------------------------------------------------------------------------

/** Administrators close any stream connection, others their own (the API's rule). */
function mayClose(conn) {
  const s = session();
  return hasTag('administrator') || (s && s.name === conn.user);
}

/** Ask, then close stream connection `name` of `vhost`; true when it was closed. */
async function closeStreamConnection(vhost, name) {
  if (!(await confirmDialog(`Close stream connection ${name}? The client is told "Closed via management plugin".`,
    'Close connection'))) {
    return false;
  }
  try {
    await DELETE(p`/api/stream/connections/${vhost}/${name}`);
    toast('Stream connection closed.');
    return true;
  } catch (exc) {
    toast(exc.describe(), 'error');
    return false;
  }
}

function clientOf(c) {
  const props = c.client_properties || {};
  const product = [props.product, props.version].filter(Boolean).join(' ');
  return [props.connection_name ? h('div', {}, props.connection_name) : null,
    product ? h('div', {class: 'muted small'}, product) : (props.connection_name ? null : h('span', {class: 'muted'}, 'unknown'))];
}

export function streamConnectionsPage(ctx) {
  const vhost = ctx.vhost;
  const table = new DataTable({
    noun: 'stream connection', sort: 'name', label: 'Stream connections',
    load: scopedList('/api/stream/connections', vhost),
    columns: [
      {label: 'Name', key: 'name', render: (c) => link(streamConnectionHref(c.vhost, c.name), c.name)},
      ...(vhost ? [] : [{label: 'Virtual host', key: 'vhost'}]),
      {label: 'User', key: 'user'},
      {label: 'Client', key: 'client_properties.connection_name', render: clientOf},
      {label: 'TLS', key: 'ssl', render: (c) => (c.ssl ? 'yes' : 'no')},
      {label: 'Publishers', key: 'publishers', num: true},
      {label: 'Consumers', key: 'subscriptions', num: true},
      {label: 'Heartbeat', key: 'heartbeat', num: true, render: (c) => (c.heartbeat ? `${c.heartbeat} s` : 'off')},
      {label: 'Connected', key: 'connected_at', nowrap: true, render: (c) => dateTime(c.connected_at)},
      {label: 'Action', sort: false, render: (c) => (mayClose(c) ? h('button', {type: 'button', class: 'secondary small',
        onclick: async () => { await closeStreamConnection(c.vhost, c.name); table.refresh(); }}, 'Close') : null)},
    ],
  });
  const el = h('div', {}, tabs('connections'), table.el);
  return {title: 'Stream connections', nav: 'streams', el, refresh: () => table.refresh(), vhostScoped: true};
}

export function streamConnectionPage(ctx, [vhost, name]) {
  const summary = h('div', {}, 'Loading…');
  const base = p`/api/stream/connections/${vhost}/${name}`;
  const pubs = new DataTable({noun: 'publisher', filter: false, label: 'Publishers',
    load: clientList(() => GET(base + '/publishers'), ['reference']), columns: publisherColumns(false)});
  const subs = new DataTable({noun: 'consumer', filter: false, label: 'Consumers',
    load: clientList(async () => (await GET(base + '/consumers')).map((s) => ({...s, name: s.stream}))),
    columns: [
      {label: 'Subscription', key: 'subscription_id', num: true},
      {label: 'Stream', key: 'stream', render: (s) => link(streamHref(s.queue.vhost, s.stream), s.stream)},
      {label: 'Offset', key: 'offset', num: true},
      {label: 'Lag', key: 'offset_lag', num: true, render: (s) => lag(s.offset_lag)},
      {label: 'Credit', key: 'credits', num: true},
      {label: 'Consumed', key: 'messages_consumed', num: true},
      {label: 'Active', key: 'active', render: (s) => (s.active ? badge('active', 'ok') : badge('waiting', 'muted'))},
    ]});
  const close = h('div');
  const el = h('div', {}, section('Details', summary), section('Publishers', pubs.el), section('Consumers', subs.el), close);

  async function refresh() {
    const c = await GET(base);
    fill(summary, facts([
      ['Virtual host', c.vhost],
      ['User', c.user],
      ['Client', clientOf(c)],
      ['Peer', `${c.peer_host}:${c.peer_port}`],
      ['TLS', c.ssl ? 'yes' : 'no'],
      ['Authentication', c.auth_mechanism],
      ['Frame max', `${num(c.frame_max)} bytes`],
      ['Heartbeat', c.heartbeat ? `${c.heartbeat} s` : 'off'],
      ['Node', c.node],
      ['Connected', dateTime(c.connected_at)],
    ]));
    fill(close, mayClose(c) ? section('Close', h('button', {type: 'button', class: 'danger', onclick: async () => {
      if (await closeStreamConnection(vhost, name)) location.hash = '#/stream-connections';
    }}, 'Close this connection')) : null);
    await Promise.all([pubs.refresh(), subs.refresh()]);
  }
  return {title: `Stream connection ${name}`, nav: 'streams', el, refresh,
    crumbs: [['Stream connections', '#/stream-connections'], [`virtual host ${vhost}`, null]]};
}
