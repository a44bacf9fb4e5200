// #/queues (the list, and a form to add a queue) and #/queues/{vhost}/{name} (one queue: figures,
// charts, consumers, bindings, publish, get, purge, delete).

import {DELETE, GET, p, POST, PUT} from './api.js';
import {History, LineChart} from './chart.js';
import {
  bindForm, bindingsTable, exchangeLabel, features, featuresKey, keyValues, policyBadges, publishForm, queueHref,
} from './common.js';
import {badge, checkbox, confirmDialog, facts, field, fill, h, link, section, select, toast} from './dom.js';
import {bytes, num, rate, statRate, value} from './fmt.js';
import {actionForm, input, KeyValueEditor, vhostSelect} from './forms.js';
import {HISTORY_QUERY, LENGTH_SERIES, RATE_SERIES, RateTracker, seedHistories, withCounterRates} from './series.js';
import {clientList, DataTable, serverList} from './table.js';

const QUEUE_ARGUMENTS = [
  ['x-message-ttl', 'number', 'How long a message can stay in the queue, in milliseconds'],
  ['x-expires', 'number', 'Delete the queue after it has been unused this many milliseconds'],
  ['x-max-length', 'number', 'How many ready messages the queue keeps at most'],
  ['x-max-length-bytes', 'number', 'Total body size of ready messages the queue keeps at most'],
  ['x-overflow', 'string', 'drop-head, reject-publish or reject-publish-dlx'],
  ['x-dead-letter-exchange', 'string', 'Exchange that rejected or expired messages are republished to'],
  ['x-dead-letter-routing-key', 'string', 'Routing key for dead-lettered messages'],
  ['x-max-priority', 'number', 'Highest priority the queue supports (classic queues)'],
  ['x-single-active-consumer', 'boolean', 'Deliver to one consumer at a time'],
  ['x-delivery-limit', 'number', 'Dead-letter or drop a message after this many deliveries'],
];

const TRAFFIC = ['publish', 'deliver_get', 'ack', 'redeliver'];

/** The server's state, or "idle" for a running queue whose message rates are all known and zero. */
export function queueState(q) {
  const s = q.state || 'running';
  const rates = TRAFFIC.map((name) => statRate(q, name));
  return s === 'running' && rates.every((r) => r === 0 || r === undefined) && rates.some((r) => r === 0) ? 'idle' : s;
}

const STATE_HELP = {running: 'messages are moving', idle: 'no messages published, delivered or acknowledged lately',
  down: 'the node that holds the queue cannot be reached'};

function state(q) {
  const s = queueState(q);
  return badge(s, s === 'running' ? 'ok' : s === 'idle' ? 'muted' : 'warn', STATE_HELP[s]);
}

// -- a queue's settings as text: x-arguments, its policy and its operator policy -------------------

const ms = (v) => (v % 1000 ? `${num(v)} ms` : `${num(v / 1000)} s (${num(v)} ms)`);
/** [label, x-argument, policy key, text of a value]; NUMERIC ones: the operator policy caps them. */
const SETTINGS = [
  ['Message TTL', 'x-message-ttl', 'message-ttl', ms],
  ['Expires', 'x-expires', 'expires', (v) => `after ${ms(v)} unused`],
  ['Max length', 'x-max-length', 'max-length', (v) => `${num(v)} messages`],
  ['Max length (bytes)', 'x-max-length-bytes', 'max-length-bytes', (v) => `${bytes(v)} (${num(v)} bytes)`],
  ['Overflow', 'x-overflow', 'overflow', String],
  ['Dead-letter exchange', 'x-dead-letter-exchange', 'dead-letter-exchange', (v) => (v === '' ? '(AMQP default)' : v)],
  ['Dead-letter routing key', 'x-dead-letter-routing-key', 'dead-letter-routing-key', (v) => `"${v}"`],
  ['Dead-letter strategy', 'x-dead-letter-strategy', 'dead-letter-strategy', String],
  ['Delivery limit', 'x-delivery-limit', 'delivery-limit', (v) => (v < 0 ? 'none' : `${num(v)} deliveries`)],
  ['Max priority', 'x-max-priority', 'max-priority', String],
  ['Single active consumer', 'x-single-active-consumer', null, (v) => (v ? 'yes: one consumer at a time' : 'no')],
  ['Leader locator', 'x-queue-leader-locator', 'queue-leader-locator', String],
];
const NUMERIC = new Set(['message-ttl', 'expires', 'max-length', 'max-length-bytes', 'delivery-limit']);

/**
 * The settings of queue `q` as [label, text] lines, with where each comes from. The rule is hutch's
 * (docs/policies.md): an x-argument beats the policy; an operator policy beats both, except for the
 * numeric keys, where the smaller value applies. `policy` and `operator` are the definitions of the
 * queue's policy and operator policy ({} when none or not readable).
 */
export function settingLines(q, policy = {}, operator = {}) {
  const args = q.arguments || {};
  const lines = [['Type', q.type === 'quorum' ? 'quorum (replicated with Raft)' : q.type || 'classic']];
  for (const [label, arg, key, show] of SETTINGS) {
    let value;
    let source;
    if (arg in args) [value, source] = [args[arg], `argument ${arg}`];
    else if (key && key in policy) [value, source] = [policy[key], `policy ${q.policy}`];
    if (key && key in operator) {
      const capped = NUMERIC.has(key) && value !== undefined && value <= operator[key];
      if (!capped) [value, source] = [operator[key], `operator policy ${q.operator_policy}`];
    }
    if (value === undefined) continue;
    lines.push([label, `${show(value)}, from ${source}`]);
  }
  const has = (label) => lines.some(([l]) => l === label);
  if ((has('Max length') || has('Max length (bytes)')) && !has('Overflow')) {
    lines.push(['Overflow', 'drop-head (the default: the oldest messages are dropped or dead-lettered)']);
  }
  if (has('Dead-letter exchange') && !has('Dead-letter routing key')) {
    lines.push(['Dead-letter routing key', 'the message\'s own routing key']);
  }
  return lines;
}

/** Where a queue runs: its node, or for a replicated queue its leader and members. */
function placement(q) {
  if (Array.isArray(q.members) && q.members.length) {
    const others = q.members.filter((m) => m !== q.leader);
    return h('span', {title: 'Members: ' + q.members.join(', ')}, q.leader || '(no leader)',
      others.length ? h('span', {class: 'muted'}, ` +${others.length}`) : null);
  }
  return q.leader || q.node || '—';
}

export function queuesPage(ctx) {
  const vhost = ctx.vhost;
  const columns = [
    ...(vhost ? [] : [{label: 'Virtual host', key: 'vhost'}]),
    {label: 'Name', key: 'name', render: (q) => link(queueHref(q.vhost, q.name), q.name)},
    {label: 'Type', key: 'type'},
    {label: 'Features', sort: false, render: (q) => [features(q), ' ', policyBadges(q)]},
    {label: 'State', key: 'state', render: state},
    {label: 'Ready', key: 'messages_ready', num: true},
    {label: 'Unacked', key: 'messages_unacknowledged', num: true},
    {label: 'Total', key: 'messages', num: true},
    {label: 'Incoming', key: 'message_stats.publish_details.rate', num: true, title: 'messages published per second',
      render: (q) => rate(statRate(q, 'publish'))},
    {label: 'Deliver / get', key: 'message_stats.deliver_get_details.rate', num: true,
      render: (q) => rate(statRate(q, 'deliver_get'))},
    {label: 'Ack', key: 'message_stats.ack_details.rate', num: true, render: (q) => rate(statRate(q, 'ack'))},
    {label: 'Consumers', key: 'consumers', num: true},
    {label: 'Node / leader', key: 'leader', render: placement, title: 'node of a classic queue; leader (+ other members) of a quorum queue'},
  ];
  const table = new DataTable({noun: 'queue', columns, sort: 'name',
    load: withCounterRates(serverList(vhost ? p`/api/queues/${vhost}` : '/api/queues'), (q) => `${q.vhost}\n${q.name}`,
      ['message_stats.publish', 'message_stats.deliver_get', 'message_stats.ack'])});

  const vh = vhostSelect(vhost || '/');
  const name = input({required: true});
  const type = select([['classic', 'Classic'], ['quorum', 'Quorum'], ['stream', 'Stream']]);
  const durable = select([['true', 'Durable'], ['false', 'Transient']]);
  const autoDelete = checkbox('Auto delete (when its last consumer goes)');
  const args = new KeyValueEditor({legend: 'Arguments', suggestions: QUEUE_ARGUMENTS});
  type.addEventListener('change', () => {
    if (type.value !== 'classic') durable.value = 'true';
    durable.disabled = type.value !== 'classic';
  });
  const form = actionForm({
    label: 'Add a new queue', submit: 'Add queue',
    fields: [h('div', {class: 'row'}, field('Virtual host', vh), field('Name', name), field('Type', type),
      field('Durability', durable)), autoDelete.el, args.el],
    async action() {
      if (!name.value.trim()) throw new Error('Give the queue a name.');
      const arguments_ = args.value();
      if (type.value !== 'classic') arguments_['x-queue-type'] = type.value;
      await PUT(p`/api/queues/${vh.value}/${name.value}`, {
        durable: durable.value === 'true', auto_delete: autoDelete.input.checked, arguments: arguments_,
      });
      const created = name.value;
      name.value = '';
      args.reset();
      table.refresh();
      return `Queue '${created}' added to virtual host '${vh.value}'.`;
    },
  });
  const el = h('div', {}, table.el, featuresKey(), h('details', {class: 'panel add'}, h('summary', {}, 'Add a new queue'), form));
  return {title: 'Queues', nav: 'queues', el, refresh: () => table.refresh(), vhostScoped: true};
}

// -- one queue --------------------------------------------------------------------------------------

const ACK_MODES = [
  ['ack_requeue_true', 'Nack, requeue: the messages stay in the queue'],
  ['reject_requeue_true', 'Reject, requeue: the messages stay in the queue'],
  ['ack_requeue_false', 'Ack: the messages are removed from the queue'],
  ['reject_requeue_false', 'Reject, no requeue: removed (dead-lettered if configured)'],
];

function messageCard(m, i) {
  const props = {...(m.properties || {})};
  const headers = props.headers;
  delete props.headers;
  return h('article', {class: 'message', 'aria-label': `Message ${i + 1}`},
    h('h3', {}, `Message ${i + 1}`),
    facts([
      ['Exchange', exchangeLabel(m.exchange)],
      ['Routing key', m.routing_key],
      ['Redelivered', m.redelivered ? 'yes' : 'no'],
      ['Remaining in queue', num(m.message_count)],
      ['Properties', keyValues(props)],
      ['Headers', headers ? keyValues(headers) : undefined],
      ['Payload', `${num(m.payload_bytes)} bytes, encoded as ${m.payload_encoding}`],
    ]),
    h('pre', {class: 'payload'}, value(m.payload)));
}

function getForm(vhost, name, results, onDone) {
  const ackmode = select(ACK_MODES);
  const encoding = select([['auto', 'Auto: string if it is text, else base64'], ['base64', 'Base64']]);
  const count = input({type: 'number', min: 1, value: '1', inputmode: 'numeric'});
  return actionForm({
    label: 'Get messages', submit: 'Get messages',
    fields: [
      h('p', {class: 'hint'}, 'Getting messages is destructive unless the mode requeues them.'),
      h('div', {class: 'row'}, field('Ack mode', ackmode), field('Encoding', encoding), field('Messages', count)),
    ],
    async action() {
      const n = Number(count.value);
      if (!Number.isInteger(n) || n < 1) throw new Error('Messages: give a whole number, 1 or more.');
      const got = await POST(p`/api/queues/${vhost}/${name}/get`,
        {count: n, ackmode: ackmode.value, encoding: encoding.value, truncate: 50000});
      const list = Array.isArray(got) ? got : [];
      fill(results, list.length ? list.map(messageCard) : h('p', {class: 'muted'}, 'Queue is empty.'));
      onDone();
      return list.length ? `Got ${list.length} message${list.length === 1 ? '' : 's'}.` : 'Queue is empty.';
    },
  });
}

export function queuePage(ctx, [vhost, name]) {
  const lengths = new History();
  const rates = new History();
  const tracker = new RateTracker(RATE_SERIES.map((s) => s.key));
  let seeded = false;
  const lengthsChart = new LineChart({title: 'Queued messages', series: LENGTH_SERIES, history: lengths});
  const ratesChart = new LineChart({title: 'Message rates', series: RATE_SERIES, kind: 'rate', history: rates});
  const summary = h('div', {class: 'summary'}, 'Loading…');
  const settings = h('div', {class: 'settings'}, 'Loading…');
  const consumers = new DataTable({
    noun: 'consumer', filter: false,
    load: clientList(async () => (await GET(p`/api/consumers/${vhost}`)).filter((c) => c.queue && c.queue.name === name)),
    columns: [
      {label: 'Channel', key: 'channel_details.name'},
      {label: 'Consumer tag', key: 'consumer_tag'},
      {label: 'Ack required', key: 'ack_required', render: (c) => (c.ack_required ? 'yes' : 'no')},
      {label: 'Exclusive', key: 'exclusive', render: (c) => (c.exclusive ? 'yes' : 'no')},
      {label: 'Prefetch', key: 'prefetch_count', num: true},
      {label: 'Priority', key: 'priority', num: true},
      {label: 'Active', key: 'active', render: (c) => (c.active === false ? badge('waiting', 'muted') : badge('active', 'ok'))},
    ],
  });
  const bindings = bindingsTable({vhost, load: () => GET(p`/api/queues/${vhost}/${name}/bindings`),
    onChange: () => bindings.refresh()});
  const results = h('div', {class: 'messages', 'aria-live': 'polite'});
  const ifUnused = checkbox('Only if it has no consumers');
  const ifEmpty = checkbox('Only if it is empty');

  // after an action, show its effect without waiting for the next tick
  const refreshSoon = () => { refresh().catch(() => {}); };

  async function purge() {
    if (!(await confirmDialog(`Purge queue '${name}'? Its ready messages are deleted.`, 'Purge'))) return;
    try {
      await DELETE(p`/api/queues/${vhost}/${name}/contents`);
      toast(`Queue '${name}' purged.`);
      refreshSoon();
    } catch (exc) {
      toast(exc.describe(), 'error');
    }
  }

  async function remove() {
    if (!(await confirmDialog(`Delete queue '${name}' and its messages?`, 'Delete'))) return;
    const flags = (ifUnused.input.checked ? '&if-unused=true' : '') + (ifEmpty.input.checked ? '&if-empty=true' : '');
    try {
      await DELETE(p`/api/queues/${vhost}/${name}` + (flags ? '?' + flags.slice(1) : ''));
      toast(`Queue '${name}' deleted.`);
      location.hash = '#/queues';
    } catch (exc) {
      toast(exc.describe(), 'error');
    }
  }

  const el = h('div', {class: 'queue'},
    h('div', {class: 'queue-top'}, section('Details', summary), lengthsChart.el, ratesChart.el),
    section('Arguments and policy settings', settings),
    section('Consumers', consumers.el),
    section('Bindings', bindings.el,
      h('details', {class: 'add'}, h('summary', {}, 'Add binding to this queue'),
        bindForm({vhost, queue: name, onChange: () => bindings.refresh()}))),
    h('div', {class: 'columns'},
      section('Publish message', publishForm(vhost, {queue: name, onDone: refreshSoon})),
      section('Get messages', getForm(vhost, name, results, refreshSoon), results)),
    section('Purge and delete',
      h('div', {class: 'danger-zone'},
        h('div', {}, h('p', {}, 'Purging removes every ready message; unacknowledged ones stay.'),
          h('button', {type: 'button', class: 'danger', onclick: purge}, 'Purge messages')),
        h('div', {}, ifUnused.el, ifEmpty.el, h('button', {type: 'button', class: 'danger', onclick: remove}, 'Delete queue')))));

  const definitionOf = (kind, policyName) => (policyName
    ? GET(`/api/${kind}/${encodeURIComponent(vhost)}/${encodeURIComponent(policyName)}`).then((x) => x.definition || {},
      () => ({}))
    : {});

  async function refresh() {
    const q = await GET(p`/api/queues/${vhost}/${name}` + (seeded ? '' : '?' + HISTORY_QUERY));
    const [policyDef, operatorDef] = await Promise.all([definitionOf('policies', q.policy),
      definitionOf('operator-policies', q.operator_policy)]);
    const now = Date.now();
    if (!seeded) {
      seedHistories(lengths, rates, q, q.message_stats, now);
      seeded = true;
    }
    lengths.push(now, {messages: q.messages, messages_ready: q.messages_ready,
      messages_unacknowledged: q.messages_unacknowledged});
    rates.push(now, tracker.rates(q.message_stats, now));
    lengthsChart.draw();
    ratesChart.draw();
    const effective = q.effective_policy_definition || {};
    const stats = q.message_stats || {};
    fill(summary, facts([
      ['Type', q.type],
      ['Features', features(q)],
      ['State', state(q)],
      ['Policy', q.policy || '—'],
      ['Operator policy', q.operator_policy || undefined],
      ['Effective policy', Object.keys(effective).length ? keyValues(effective) : undefined],
      [Array.isArray(q.members) ? 'Leader' : 'Node', q.leader || q.node],
      ['Members', Array.isArray(q.members) ? h('ul', {class: 'kvs'}, q.members.map((m) => h('li', {}, m,
        Array.isArray(q.online) && !q.online.includes(m) ? [' ', badge('offline', 'bad')] : null))) : undefined],
      ['Consumers', num(q.consumers)],
      ['Exclusive consumer', q.exclusive_consumer_tag || undefined],
      // a stream's log (docs/streams.md): its offsets, segments and where each consumer is
      ['Offsets', q.type === 'stream' ? `${num(q.first_offset)} first, ${num(q.committed_offset)} committed, ` +
        `${num(q.last_offset)} last` : undefined],
      ['Segments', q.type === 'stream' ? num(q.segments) : undefined],
      ['Consumer offsets', q.consumer_offsets && Object.keys(q.consumer_offsets).length
        ? keyValues(q.consumer_offsets) : undefined],
      ['Messages', `${num(q.messages_ready)} ready, ${num(q.messages_unacknowledged)} unacked, ${num(q.messages)} total`],
      ['Ready bytes', bytes(q.message_bytes_ready ?? q.message_bytes)],
      ['Paged out', q.messages_paged_out ? `${num(q.messages_paged_out)} of ${num(q.messages_ready)} ready` : undefined],
      ['Since created', `${num(stats.publish)} published, ${num(stats.deliver_get)} delivered or got, ` +
        `${num(stats.ack)} acknowledged`],
    ]));
    const lines = settingLines(q, policyDef, operatorDef);
    fill(settings, facts(lines), h('p', {class: 'hint'}, 'An x-argument beats the policy; an operator policy ' +
      'beats both, except for the numeric limits, where the smaller value applies (docs/policies.md).'));
    await Promise.all([consumers.refresh(), bindings.refresh()]);
  }

  return {
    title: `Queue ${name}`, nav: 'queues', el, refresh,
    crumbs: [['Queues', '#/queues'], [`virtual host ${vhost}`, null]],
    destroy() { lengthsChart.destroy(); ratesChart.destroy(); },
  };
}
