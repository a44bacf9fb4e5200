// Pieces several pages share: feature badges, the publish-message form, bindings tables.

import {DELETE, p, POST} from './api.js';
import {badge, confirmDialog, field, h, link, select, toast} from './dom.js';
import {value} from './fmt.js';
import {actionForm, input, KeyValueEditor} from './forms.js';
import {clientList, DataTable} from './table.js';

export const DEFAULT_EXCHANGE = 'amq.default';

/** The arguments with a badge of their own (RabbitMQ's short names); the rest show as "Args". */
export const ARGUMENT_BADGES = [
  ['x-message-ttl', 'TTL', 'message time to live'],
  ['x-expires', 'Exp', 'the queue expires when unused'],
  ['x-max-length', 'Lim', 'maximum length in messages'],
  ['x-max-length-bytes', 'Lim B', 'maximum length in bytes'],
  ['x-overflow', 'Ovfl', 'what happens when the queue is full'],
  ['x-dead-letter-exchange', 'DLX', 'dead-letter exchange'],
  ['x-dead-letter-routing-key', 'DLK', 'dead-letter routing key'],
  ['x-delivery-limit', 'DlL', 'delivery limit'],
  ['x-max-priority', 'Pri', 'maximum priority'],
  ['x-single-active-consumer', 'SAC', 'single active consumer'],
  ['alternate-exchange', 'AE', 'alternate exchange'],
];
const BADGED = new Map(ARGUMENT_BADGES.map(([arg, short, help]) => [arg, [short, help]]));
const UNBADGED = new Set(['x-queue-type']);  // the Type column says it

/** Badges for durable / auto-delete / exclusive / internal and the arguments (TTL, DLX, Lim, SAC, …). */
export function features(obj) {
  const out = [];
  if (obj.durable) out.push(badge('D', 'info', 'durable'));
  else out.push(badge('T', 'muted', 'transient (not durable)'));
  if (obj.auto_delete) out.push(badge('AD', 'muted', 'auto-delete'));
  if (obj.exclusive) out.push(badge('Excl', 'muted', 'exclusive'));
  if (obj.internal) out.push(badge('I', 'muted', 'internal'));
  const rest = [];
  for (const [k, v] of Object.entries(obj.arguments || {})) {
    const known = BADGED.get(k);
    if (known && !(k === 'x-single-active-consumer' && v === false)) {
      out.push(badge(known[0], 'muted', `${known[1]}: ${k} = ${value(v)}`));
    } else if (!known && !UNBADGED.has(k)) rest.push(`${k}: ${value(v)}`);
  }
  if (rest.length) out.push(badge('Args', 'muted', rest.join('\n')));
  return h('span', {class: 'features'}, out);
}

/** What the feature badges mean, under a table that shows them. */
export function featuresKey(extra = '', onlyArgs = null) {
  const shown = ARGUMENT_BADGES.filter(([arg]) => !onlyArgs || onlyArgs.includes(arg));
  return h('p', {class: 'hint key'}, 'Features: D durable, T transient, AD auto-delete, Excl exclusive, ',
    extra, shown.map(([, short, help]) => `${short} ${help}, `).join(''),
    'Args other arguments (hover a badge for its value); a blue name is the policy in effect.');
}

/** A policy name (and operator policy) as badges. */
export function policyBadges(obj) {
  return h('span', {class: 'features'}, obj.policy ? badge(obj.policy, 'info', 'policy') : null,
    obj.operator_policy ? badge(obj.operator_policy, 'warn', 'operator policy') : null);
}

export function queueHref(vhost, name) {
  return `#/queues/${encodeURIComponent(vhost)}/${encodeURIComponent(name)}`;
}

export const userHref = (name) => `#/users/${encodeURIComponent(name)}`;
export const vhostHref = (name) => `#/vhosts/${encodeURIComponent(name)}`;
export const connectionHref = (name) => `#/connections/${encodeURIComponent(name)}`;
export const channelHref = (name) => `#/channels/${encodeURIComponent(name)}`;

export function exchangeHref(vhost, name) {
  return `#/exchanges/${encodeURIComponent(vhost)}/${encodeURIComponent(name || DEFAULT_EXCHANGE)}`;
}

export function exchangeLabel(name) {
  return name === '' || name === DEFAULT_EXCHANGE ? '(AMQP default)' : name;
}

/** A key/value list of an object (arguments, definitions, properties). */
export function keyValues(obj) {
  const entries = Object.entries(obj || {});
  if (!entries.length) return '—';
  return h('ul', {class: 'kvs'}, entries.map(([k, v]) => h('li', {}, h('span', {class: 'k'}, k), ': ', value(v))));
}

const PROPERTY_SUGGESTIONS = [
  ['content_type', 'string', 'MIME type of the payload, e.g. application/json'],
  ['correlation_id', 'string', 'application correlation identifier'],
  ['reply_to', 'string', 'queue to reply to'],
  ['message_id', 'string', 'application message identifier'],
  ['expiration', 'string', 'per-message TTL in milliseconds, as a string'],
  ['priority', 'number', 'message priority, 0 to 9'],
  ['type', 'string', 'message type name'],
  ['app_id', 'string', 'creating application id'],
];

/**
 * Publish a message: POST /api/exchanges/{vhost}/{exchange}/publish. With `queue`, the message goes
 * to that queue through the default exchange (the routing key is the queue name).
 */
export function publishForm(vhost, {exchange = DEFAULT_EXCHANGE, queue = null, onDone = () => {}} = {}) {
  const routingKey = input({value: queue || '', readonly: queue !== null});
  const mode = select([['2', '2 - Persistent'], ['1', '1 - Non-persistent']]);
  const headers = new KeyValueEditor({legend: 'Headers', keyLabel: 'Header', valueLabel: 'Value'});
  const props = new KeyValueEditor({legend: 'Properties', keyLabel: 'Property', valueLabel: 'Value',
    suggestions: PROPERTY_SUGGESTIONS});
  const payload = h('textarea', {rows: 4, spellcheck: 'false'});
  const encoding = select([['string', 'String'], ['base64', 'Base64']]);
  const fields = [
    queue === null ? field('Routing key', routingKey)
      : field('Routing key', routingKey, 'Published through the default exchange, straight to this queue.'),
    field('Delivery mode', mode),
    headers.el, props.el,
    field('Payload', payload),
    field('Payload encoding', encoding),
  ];
  return actionForm({
    label: 'Publish message', fields, submit: 'Publish message',
    async action() {
      const properties = {delivery_mode: Number(mode.value), ...props.value()};
      const hdrs = headers.value();
      if (Object.keys(hdrs).length) properties.headers = hdrs;
      const reply = await POST(p`/api/exchanges/${vhost}/${exchange}/publish`, {
        properties, routing_key: routingKey.value, payload: payload.value, payload_encoding: encoding.value,
      });
      onDone();
      if (reply && reply.routed === false) return 'Message published, but not routed to any queue.';
      return queue !== null ? 'Message published.' : 'Message published and routed.';
    },
  });
}

/** The bindings of a destination (queue) or a source (exchange), with unbind buttons. */
export function bindingsTable({vhost, load, showSource = true, onChange}) {
  const unbind = async (b) => {
    const kind = b.destination_type === 'queue' ? 'q' : 'e';
    const ok = await confirmDialog(`Remove the binding from ${exchangeLabel(b.source)} to ${b.destination} ` +
      `with routing key "${b.routing_key}"?`, 'Unbind');
    if (!ok) return;
    try {
      await DELETE(p`/api/bindings/${vhost}/e/${b.source}/${kind}/${b.destination}/${b.properties_key}`);
      toast('Binding removed.');
    } catch (exc) {
      toast(exc.describe ? exc.describe() : String(exc), 'error');
    }
    onChange();
  };
  return new DataTable({
    noun: 'binding', filter: false, load: clientList(load),
    columns: [
      showSource
        ? {label: 'From exchange', key: 'source', render: (b) => b.source === ''
          ? h('span', {class: 'muted'}, '(AMQP default)') : link(exchangeHref(vhost, b.source), b.source)}
        : {label: 'To', key: 'destination', render: (b) => b.destination_type === 'queue'
          ? link(queueHref(vhost, b.destination), b.destination)
          : link(exchangeHref(vhost, b.destination), b.destination)},
      ...(showSource ? [] : [{label: 'Type', key: 'destination_type'}]),
      {label: 'Routing key', key: 'routing_key'},
      {label: 'Arguments', key: 'arguments', sort: false, render: (b) => keyValues(b.arguments)},
      {label: 'Action', sort: false, render: (b) => b.source === ''
        ? h('span', {class: 'muted'}, 'implicit')
        : h('button', {type: 'button', class: 'secondary small', onclick: () => unbind(b)}, 'Unbind')},
    ],
  });
}

/** Add a binding: from an exchange to this queue, or from this exchange to a queue or exchange. */
export function bindForm({vhost, queue = null, exchange = null, onChange}) {
  const other = input({required: true});
  const kind = select([['q', 'Queue'], ['e', 'Exchange']]);
  const key = input();
  const args = new KeyValueEditor({legend: 'Arguments'});
  const fields = queue !== null
    ? [field('From exchange', other), field('Routing key', key), args.el]
    : [field('To', kind), field('Name', other), field('Routing key', key), args.el];
  return actionForm({
    label: 'Add binding', fields, submit: 'Bind',
    async action() {
      if (!other.value) throw new Error('Give the name of the ' + (queue !== null ? 'exchange.' : 'destination.'));
      const body = {routing_key: key.value, arguments: args.value()};
      if (queue !== null) await POST(p`/api/bindings/${vhost}/e/${other.value}/q/${queue}`, body);
      else await POST(p`/api/bindings/${vhost}/e/${exchange}/${kind.value}/${other.value}`, body);
      onChange();
      return 'Binding added.';
    },
  });
}
