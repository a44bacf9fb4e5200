// Shovel and Federation pages: #/shovels (dynamic shovels with their state, restart and delete, a form
// to add one, "Move messages" and the dead-letter redrive as temporary shovels) and #/federation (links
// and their status, upstreams with a form to add one). Both are thin views of the HTTP API
// (docs/shovel.md, docs/federation.md).

import {DELETE, GET, p, PUT} from './api.js';
import {badge, confirmDialog, field, h, select, toast} from './dom.js';
import {actionForm, input, vhostSelect} from './forms.js';
import {clientList, DataTable} from './table.js';

const STATE_KIND = {running: 'ok', starting: 'info', terminated: 'bad', error: 'bad'};

function stateBadge(state, reason) {
  return [badge(state, STATE_KIND[state] || 'muted'), reason ? h('div', {class: 'muted'}, reason) : null];
}

function rowButton(label, question, run, after) {
  return h('button', {type: 'button', class: 'secondary small', onclick: async () => {
    if (question && !(await confirmDialog(question, label))) return;
    try {
      await run();
      toast(`${label}: done.`);
    } catch (exc) {
      toast(exc.describe ? exc.describe() : String(exc), 'error');
    }
    after();
  }}, label);
}

function panel(title, form, open = false) {
  return h('details', {class: 'panel add', open}, h('summary', {}, title), form);
}

async function putShovel(vhost, name, value) {
  await PUT(p`/api/parameters/shovel/${vhost}/${name}`, {value});
}

function scoped(path, vhost) {
  return vhost ? `${path}/${encodeURIComponent(vhost)}` : path;
}

export function shovelsPage(ctx) {
  const table = new DataTable({
    noun: 'shovel', sort: 'name',
    load: clientList(() => GET(scoped('/api/shovels', ctx.vhost)), ['name', 'vhost', 'state']),
    columns: [
      {label: 'Name', key: 'name'},
      {label: 'Virtual host', key: 'vhost'},
      {label: 'State', key: 'state', render: (s) => stateBadge(s.state, s.reason)},
      {label: 'Source', sort: false, render: (s) => [s.src_uri || '', ' ', h('code', {}, s.src_queue || s.src_exchange || '')]},
      {label: 'Destination', sort: false, render: (s) => [s.dest_uri || '', ' ', h('code', {}, s.dest_queue || s.dest_exchange || '')]},
      {label: 'Moved', key: 'messages_acknowledged', num: true},
      {label: 'Node', key: 'node'},
      {label: 'Since', key: 'timestamp'},
      {label: 'Action', sort: false, render: (s) => [
        rowButton('Restart', null, () => DELETE(p`/api/shovels/vhost/${s.vhost}/${s.name}/restart`), () => table.refresh()), ' ',
        rowButton('Delete', `Delete shovel '${s.name}'?`, () => DELETE(p`/api/parameters/shovel/${s.vhost}/${s.name}`),
          () => table.refresh())]},
    ],
  });

  const vh = vhostSelect(ctx.vhost || '/');
  const name = input();
  const srcUri = input({value: 'amqp://', placeholder: 'amqp://user:pass@host:5672/%2F'});
  const srcQueue = input({placeholder: 'queue to consume'});
  const destUri = input({value: 'amqp://'});
  const destQueue = input({placeholder: 'queue to publish to'});
  const ackMode = select([['on-confirm', 'on-confirm'], ['on-publish', 'on-publish'], ['no-ack', 'no-ack']]);
  const deleteAfter = select([['never', 'never'], ['queue-length', 'queue-length']]);
  const addForm = actionForm({
    label: 'Add a shovel', submit: 'Add shovel',
    fields: [h('div', {class: 'row'}, field('Virtual host', vh), field('Name', name),
      field('Source URI', srcUri, 'amqp:// alone is this node.'), field('Source queue', srcQueue),
      field('Destination URI', destUri), field('Destination queue', destQueue), field('Ack mode', ackMode),
      field('Delete after', deleteAfter))],
    async action() {
      if (!name.value || !srcQueue.value || !destQueue.value) throw new Error('Give a name, a source queue and a destination queue.');
      await putShovel(vh.value, name.value, {'src-uri': srcUri.value, 'src-queue': srcQueue.value, 'dest-uri': destUri.value,
        'dest-queue': destQueue.value, 'ack-mode': ackMode.value, 'src-delete-after': deleteAfter.value});
      table.refresh();
      return `Shovel '${name.value}' added.`;
    },
  });

  const moveVh = vhostSelect(ctx.vhost || '/');
  const from = input({placeholder: 'source queue'});
  const to = input({placeholder: 'destination queue'});
  const moveForm = actionForm({
    label: 'Move messages', submit: 'Move messages',
    fields: [h('p', {class: 'muted'}, 'Moves the messages a queue holds now to another queue, with a temporary shovel that removes itself when done.'),
      h('div', {class: 'row'}, field('Virtual host', moveVh), field('From queue', from), field('To queue', to))],
    async action() {
      if (!from.value || !to.value) throw new Error('Give both queues.');
      await putShovel(moveVh.value, `Move from ${from.value}`, {'src-uri': 'amqp://', 'src-queue': from.value,
        'dest-uri': 'amqp://', 'dest-queue': to.value, 'src-delete-after': 'queue-length'});
      table.refresh();
      return `Moving the messages of '${from.value}' to '${to.value}'.`;
    },
  });

  const dlqVh = vhostSelect(ctx.vhost || '/');
  const dlq = input({placeholder: 'dead-letter queue'});
  const redriveForm = actionForm({
    label: 'Redrive dead letters', submit: 'Redrive',
    fields: [h('p', {class: 'muted'}, 'Sends each message of a dead-letter queue back to the queue it died in (its x-death header), as hutch-queues redrive does.'),
      h('div', {class: 'row'}, field('Virtual host', dlqVh), field('Dead-letter queue', dlq))],
    async action() {
      if (!dlq.value) throw new Error('Give the dead-letter queue.');
      await putShovel(dlqVh.value, `redrive-${dlq.value}`, {'src-uri': 'amqp://', 'src-queue': dlq.value, 'dest-uri': 'amqp://',
        'dest-queue-from-x-death': true, 'src-delete-after': 'queue-length'});
      table.refresh();
      return `Redriving '${dlq.value}'.`;
    },
  });
  return {title: 'Shovels', nav: 'shovels', vhostScoped: true,
    el: h('div', {}, table.el, panel('Add a shovel', addForm), panel('Move messages', moveForm),
      panel('Redrive dead letters', redriveForm)),
    refresh: () => table.refresh()};
}

export function federationPage(ctx) {
  const links = new DataTable({
    noun: 'federation link', sort: 'upstream',
    load: clientList(() => GET(scoped('/api/federation-links', ctx.vhost)), ['upstream', 'exchange', 'queue']),
    columns: [
      {label: 'Upstream', key: 'upstream'},
      {label: 'Virtual host', key: 'vhost'},
      {label: 'Type', key: 'type'},
      {label: 'Exchange / queue', sort: false, render: (l) => h('code', {}, l.exchange || l.queue)},
      {label: 'URI', key: 'uri'},
      {label: 'Status', key: 'status', render: (l) => stateBadge(l.status, l.error)},
      {label: 'Forwarded', key: 'messages_forwarded', num: true},
      {label: 'Since', key: 'timestamp'},
    ],
  });
  const upstreams = new DataTable({
    noun: 'upstream', sort: 'name',
    load: clientList(() => GET(scoped('/api/parameters/federation-upstream', ctx.vhost)), ['name']),
    columns: [
      {label: 'Name', key: 'name'},
      {label: 'Virtual host', key: 'vhost'},
      {label: 'URI', sort: false, render: (u) => String(u.value.uri).replace(/:[^:@/]*@/, ':***@')},
      {label: 'Max hops', sort: false, render: (u) => u.value['max-hops'] || 1},
      {label: 'Action', sort: false, render: (u) => rowButton('Delete', `Delete upstream '${u.name}'?`,
        () => DELETE(p`/api/parameters/federation-upstream/${u.vhost}/${u.name}`), () => upstreams.refresh())},
    ],
  });
  const vh = vhostSelect(ctx.vhost || '/');
  const name = input();
  const uri = input({placeholder: 'amqp://user:pass@host:5672/%2F'});
  const hops = input({type: 'number', value: '1', inputmode: 'numeric'});
  const form = actionForm({
    label: 'Add an upstream', submit: 'Add upstream',
    fields: [h('p', {class: 'muted'}, 'Then federate exchanges or queues with a policy whose definition has federation-upstream (this name) or federation-upstream-set "all".'),
      h('div', {class: 'row'}, field('Virtual host', vh), field('Name', name), field('URI', uri), field('Max hops', hops))],
    async action() {
      if (!name.value || !uri.value) throw new Error('Give a name and a URI.');
      await PUT(p`/api/parameters/federation-upstream/${vh.value}/${name.value}`,
        {value: {uri: uri.value, 'max-hops': Number(hops.value) || 1}});
      upstreams.refresh();
      return `Upstream '${name.value}' added.`;
    },
  });
  return {title: 'Federation', nav: 'federation', vhostScoped: true,
    el: h('div', {}, links.el, h('h2', {class: 'sub'}, 'Upstreams'), upstreams.el, panel('Add an upstream', form)),
    refresh: () => Promise.all([links.refresh(), upstreams.refresh()])};
}
