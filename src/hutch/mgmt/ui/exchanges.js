// #/exchanges (the list, and a form to add an exchange) and #/exchanges/{vhost}/{name} (one exchange:
// details, bindings from and to it, publish, delete).

import {DELETE, GET, p, PUT} from './api.js';
import {
  bindForm, bindingsTable, DEFAULT_EXCHANGE, exchangeHref, exchangeLabel, features, featuresKey, keyValues, policyBadges,
  publishForm,
} from './common.js';
import {checkbox, confirmDialog, facts, field, fill, h, link, section, select, setOptions, toast} from './dom.js';
import {rate, statRate} from './fmt.js';
import {actionForm, input, KeyValueEditor, vhostSelect} from './forms.js';
import {DataTable, serverList} from './table.js';

const EXCHANGE_ARGUMENTS = [
  ['alternate-exchange', 'string', 'Exchange that receives the messages this one cannot route'],
  ['x-delayed-type', 'string', 'x-delayed-message: the type that routes a message once its delay is over'],
  ['hash-header', 'string', 'x-consistent-hash: hash this header instead of the routing key'],
  ['hash-property', 'string', 'x-consistent-hash: hash message_id, correlation_id or timestamp'],
];

export function exchangesPage(ctx) {
  const vhost = ctx.vhost;
  const table = new DataTable({
    noun: 'exchange', sort: 'name', load: serverList(vhost ? p`/api/exchanges/${vhost}` : '/api/exchanges'),
    columns: [
      ...(vhost ? [] : [{label: 'Virtual host', key: 'vhost'}]),
      {label: 'Name', key: 'name', render: (x) => link(exchangeHref(x.vhost, x.name), exchangeLabel(x.name))},
      {label: 'Type', key: 'type'},
      {label: 'Features', sort: false, render: (x) => [features(x), ' ', policyBadges(x)]},
      {label: 'Message rate in', key: 'message_stats.publish_in_details.rate', num: true,
        render: (x) => rate(statRate(x, 'publish_in'))},
      {label: 'Message rate out', key: 'message_stats.publish_out_details.rate', num: true,
        render: (x) => rate(statRate(x, 'publish_out'))},
    ],
  });
  const vh = vhostSelect(vhost || '/');
  const name = input({required: true});
  const type = select(['direct', 'fanout', 'topic', 'headers']);
  GET('/api/overview?columns=exchange_types').then((o) => {
    if (Array.isArray(o.exchange_types) && o.exchange_types.length) setOptions(type, o.exchange_types.map((t) => t.name));
  }).catch(() => {});
  const durable = select([['true', 'Durable'], ['false', 'Transient']]);
  const autoDelete = checkbox('Auto delete (when its last binding goes)');
  const internal = checkbox('Internal (clients cannot publish to it directly)');
  const args = new KeyValueEditor({legend: 'Arguments', suggestions: EXCHANGE_ARGUMENTS});
  const form = actionForm({
    label: 'Add a new exchange', submit: 'Add exchange',
    fields: [h('div', {class: 'row'}, field('Virtual host', vh), field('Name', name), field('Type', type),
      field('Durability', durable)), autoDelete.el, internal.el, args.el],
    async action() {
      if (!name.value.trim()) throw new Error('Give the exchange a name.');
      await PUT(p`/api/exchanges/${vh.value}/${name.value}`, {type: type.value, durable: durable.value === 'true',
        auto_delete: autoDelete.input.checked, internal: internal.input.checked, arguments: args.value()});
      const created = name.value;
      name.value = '';
      args.reset();
      table.refresh();
      return `Exchange '${created}' added to virtual host '${vh.value}'.`;
    },
  });
  const el = h('div', {}, table.el, featuresKey('I internal, ', ['alternate-exchange']),
    h('details', {class: 'panel add'}, h('summary', {}, 'Add a new exchange'), form));
  return {title: 'Exchanges', nav: 'exchanges', el, refresh: () => table.refresh(), vhostScoped: true};
}

export function exchangePage(ctx, [vhost, name]) {
  const isDefault = name === DEFAULT_EXCHANGE || name === '';
  const summary = h('div');
  const outgoing = bindingsTable({vhost, showSource: false, onChange: () => outgoing.refresh(),
    load: () => GET(p`/api/exchanges/${vhost}/${name}/bindings/source`)});
  const incoming = bindingsTable({vhost, onChange: () => incoming.refresh(),
    load: () => GET(p`/api/exchanges/${vhost}/${name}/bindings/destination`)});

  async function remove() {
    if (!(await confirmDialog(`Delete exchange '${name}'? Its bindings are removed too.`, 'Delete'))) return;
    try {
      await DELETE(p`/api/exchanges/${vhost}/${name}`);
      toast(`Exchange '${name}' deleted.`);
      location.hash = '#/exchanges';
    } catch (exc) {
      toast(exc.describe(), 'error');
    }
  }

  const el = h('div', {},
    summary,
    section('Bindings from this exchange', isDefault
      ? h('p', {class: 'muted'}, 'The default exchange routes a message to the queue named by its routing key.')
      : [outgoing.el, h('details', {class: 'add'}, h('summary', {}, 'Add binding from this exchange'),
        bindForm({vhost, exchange: name, onChange: () => outgoing.refresh()}))]),
    isDefault ? null : section('Bindings to this exchange', incoming.el),
    section('Publish message', publishForm(vhost, {exchange: isDefault ? DEFAULT_EXCHANGE : name})),
    isDefault || name.startsWith('amq.') ? null : section('Delete',
      h('button', {type: 'button', class: 'danger', onclick: remove}, 'Delete this exchange')));

  async function refresh() {
    const x = await GET(p`/api/exchanges/${vhost}/${isDefault ? DEFAULT_EXCHANGE : name}`);
    fill(summary, section('Details', facts([
      ['Virtual host', vhost],
      ['Type', x.type],
      ['Features', features(x)],
      ['Policy', x.policy || '—'],
      ['Arguments', keyValues(x.arguments)],
      ['Message rate in', rate(statRate(x, 'publish_in'))],
      ['Message rate out', rate(statRate(x, 'publish_out'))],
      ...('messages_delayed' in x ? [['Delayed messages', String(x.messages_delayed)]] : []),
    ])));
    await Promise.all(isDefault ? [] : [outgoing.refresh(), incoming.refresh()]);
  }

  return {title: `Exchange ${exchangeLabel(name)}`, nav: 'exchanges', el, refresh,
    crumbs: [['Exchanges', '#/exchanges'], [`virtual host ${vhost}`, null]]};
}
