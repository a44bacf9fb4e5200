// Limits and the pages of one user and one virtual host: #/limits (every vhost and user limit: view,
// set, clear), #/users/{name} (tags, permissions, topic permissions, limits) and #/vhosts/{name}
// (figures, queues, permissions, limits, the default queue type where one was set).

import {DELETE, GET, hasTag, p, PUT} from './api.js';
import {traffic} from './clients.js';
import {features, queueHref, userHref, vhostHref} from './common.js';
import {badge, facts, field, fill, h, link, section, select, setOptions} from './dom.js';
import {num} from './fmt.js';
import {actionForm, forgetVhosts, input, vhostSelect} from './forms.js';
import {queueState} from './queues.js';
import {deleteButton, userDeleteWarning} from './admin.js';
import {clientList, DataTable, serverList} from './table.js';

/** The two kinds of limits: where the API keeps them and which names each has. */
const KINDS = {
  vhost: {path: '/api/vhost-limits', owner: 'vhost', label: 'Virtual host', href: vhostHref,
    names: [['max-connections', 'client connections to the virtual host'], ['max-queues', 'queues in the virtual host']]},
  user: {path: '/api/user-limits', owner: 'user', label: 'User', href: userHref,
    names: [['max-connections', 'connections of the user'], ['max-channels', 'channels of the user, over all its connections']]},
};

function limitValue(v) {
  return v < 0 ? 'no limit' : num(v);
}

/** The limits of one kind as rows {owner, name, value}: all of them, or those of `only`. */
function limitsTable(kind, only = null) {
  const k = KINDS[kind];
  const admin = hasTag('administrator');
  const load = async () => {
    const list = await GET(only === null ? k.path : `${k.path}/${encodeURIComponent(only)}`);
    return list.flatMap((entry) => Object.entries(entry.value || {}).map(([name, value]) =>
      ({owner: entry[k.owner], name, value})));
  };
  const table = new DataTable({
    noun: `${kind === 'vhost' ? 'virtual host' : 'user'} limit`, filter: only === null, sort: only === null ? 'owner' : 'name',
    empty: only === null ? `No ${kind === 'vhost' ? 'virtual host' : 'user'} has a limit.` : 'No limits: nothing is capped.',
    load: clientList(load, ['owner', 'name']),
    columns: [
      ...(only === null ? [{label: k.label, key: 'owner', render: (r) => link(k.href(r.owner), r.owner)}] : []),
      {label: 'Limit', key: 'name', render: (r) => [r.name, h('div', {class: 'muted small'},
        (k.names.find(([n]) => n === r.name) || ['', ''])[1])]},
      {label: 'Value', key: 'value', num: true, render: (r) => limitValue(r.value)},
      ...(admin ? [{label: 'Action', sort: false, render: (r) => deleteButton(`the ${r.name} limit of '${r.owner}'`,
        () => DELETE(`${k.path}/${encodeURIComponent(r.owner)}/${encodeURIComponent(r.name)}`), () => table.refresh(),
        `Clear the ${r.name} limit of ${kind === 'vhost' ? 'virtual host' : 'user'} '${r.owner}'?`, 'Clear')}] : []),
    ],
  });
  return table;
}

/** Set one limit: PUT {value} to /api/{vhost|user}-limits/{owner}/{name}; `only` fixes the owner. */
function limitForm(kind, only, onDone) {
  const k = KINDS[kind];
  let owner;
  if (only !== null) owner = null;
  else if (kind === 'vhost') owner = vhostSelect('/');
  else {
    owner = select([]);
    GET('/api/users?columns=name').then((list) => setOptions(owner, list.map((u) => u.name))).catch(() => {});
  }
  const name = select(k.names.map(([n, help]) => [n, `${n}: ${help}`]));
  const value = input({type: 'number', inputmode: 'numeric', value: '', step: 1});
  const label = `Set a ${kind === 'vhost' ? 'virtual host' : 'user'} limit`;
  return actionForm({
    label, submit: 'Set limit',
    fields: [h('div', {class: 'row'}, owner ? field(k.label, owner) : null, field('Limit', name),
      field('Value', value, '0 allows none; a negative number means no limit.'))],
    async action() {
      const target = only !== null ? only : owner.value;
      if (!target) throw new Error(`Pick a ${k.label.toLowerCase()}.`);
      const n = Number(value.value);
      if (value.value.trim() === '' || !Number.isInteger(n)) throw new Error('Value: give a whole number.');
      await PUT(`${k.path}/${encodeURIComponent(target)}/${encodeURIComponent(name.value)}`, {value: n});
      value.value = '';
      onDone();
      return `${name.value} of '${target}' set to ${limitValue(n)}.`;
    },
  });
}

export function limitsPage() {
  const vhosts = limitsTable('vhost');
  const users = limitsTable('user');
  const admin = hasTag('administrator');
  const el = h('div', {},
    h('h2', {class: 'sub'}, 'Virtual host limits'), vhosts.el,
    admin ? h('details', {class: 'panel add', open: true}, h('summary', {}, 'Set a virtual host limit'),
      limitForm('vhost', null, () => vhosts.refresh())) : null,
    h('h2', {class: 'sub'}, 'User limits'), users.el,
    admin ? h('details', {class: 'panel add', open: true}, h('summary', {}, 'Set a user limit'),
      limitForm('user', null, () => users.refresh())) : null,
    h('p', {class: 'hint'}, 'A client past a connection or channel limit is refused when it opens one; a queue ' +
      'declared past max-queues is refused. Limits set with hutchctl or the API show here too.'));
  return {title: 'Limits', nav: 'admin', tab: 'limits', el, refresh: () => Promise.all([vhosts.refresh(), users.refresh()])};
}

function permissionColumns(first) {
  return [first,
    {label: 'Configure', key: 'configure', render: (e) => h('code', {}, e.configure)},
    {label: 'Write', key: 'write', render: (e) => h('code', {}, e.write)},
    {label: 'Read', key: 'read', render: (e) => h('code', {}, e.read)}];
}

function topicColumns(first) {
  return [first, {label: 'Exchange', key: 'exchange'},
    {label: 'Write', key: 'write', render: (e) => h('code', {}, e.write)},
    {label: 'Read', key: 'read', render: (e) => h('code', {}, e.read)}];
}

const table = (noun, path, columns, extra = {}) => new DataTable({noun, filter: false, columns,
  load: clientList(() => GET(path)), ...extra});

// -- one user ---------------------------------------------------------------------------------------

export function userPage(ctx, [name]) {
  const summary = h('div', {}, 'Loading…');
  const vhostColumn = {label: 'Virtual host', key: 'vhost', render: (e) => link(vhostHref(e.vhost), e.vhost)};
  const perms = table('permission', p`/api/users/${name}/permissions`, permissionColumns(vhostColumn),
    {empty: 'No permissions: this user cannot use any virtual host.'});
  const topics = table('topic permission', p`/api/users/${name}/topic-permissions`, topicColumns(vhostColumn),
    {empty: 'No topic permissions: publishing to topic exchanges is not restricted further.'});
  const limits = limitsTable('user', name);
  const el = h('div', {},
    section('Details', summary),
    section('Permissions', perms.el, h('p', {class: 'hint'}, h('a', {href: '#/permissions'}, 'Set permissions'),
      ' on the Permissions tab.')),
    section('Topic permissions', topics.el),
    section('Limits', limits.el, limitForm('user', name, () => limits.refresh())),
    section('Delete', deleteButton(`user '${name}'`, () => DELETE(p`/api/users/${name}`),
      () => { location.hash = '#/users'; }, userDeleteWarning(name))));

  async function refresh() {
    const u = await GET(p`/api/users/${name}`);
    const tags = Array.isArray(u.tags) ? u.tags : String(u.tags || '').split(',').filter(Boolean);
    fill(summary, facts([
      ['Name', u.name],
      ['Tags', tags.length ? tags.map((t) => [badge(t, 'info'), ' ']) : h('span', {class: 'muted'}, 'none (AMQP only)')],
      ['Password', u.password_hash ? `set (${u.hashing_algorithm || 'hashed'})` : 'none: cannot log in with a password'],
    ]));
    await Promise.all([perms.refresh(), topics.refresh(), limits.refresh()]);
  }
  return {title: `User ${name}`, nav: 'admin', tab: 'users', el, refresh, crumbs: [['Users', '#/users']]};
}

// -- one virtual host -------------------------------------------------------------------------------

export function vhostPage(ctx, [name]) {
  const summary = h('div', {}, 'Loading…');
  const queues = new DataTable({
    noun: 'queue', sort: 'name', load: serverList(p`/api/queues/${name}`),
    columns: [
      {label: 'Name', key: 'name', render: (q) => link(queueHref(q.vhost, q.name), q.name)},
      {label: 'Type', key: 'type'},
      {label: 'Features', sort: false, render: features},
      {label: 'State', key: 'state', render: (q) => queueState(q)},
      {label: 'Ready', key: 'messages_ready', num: true},
      {label: 'Unacked', key: 'messages_unacknowledged', num: true},
      {label: 'Consumers', key: 'consumers', num: true},
    ],
  });
  const userColumn = {label: 'User', key: 'user', render: (e) => link(userHref(e.user), e.user)};
  const perms = table('permission', p`/api/vhosts/${name}/permissions`, permissionColumns(userColumn),
    {empty: 'No user may use this virtual host.'});
  const topics = table('topic permission', p`/api/vhosts/${name}/topic-permissions`, topicColumns(userColumn));
  const limits = limitsTable('vhost', name);
  const admin = hasTag('administrator');
  const el = h('div', {},
    section('Details', summary),
    section('Queues', queues.el),
    section('Permissions', perms.el),
    section('Topic permissions', topics.el),
    section('Limits', limits.el, admin ? limitForm('vhost', name, () => limits.refresh()) : null),
    admin ? section('Delete', deleteButton(`virtual host '${name}' and everything in it`, () => DELETE(p`/api/vhosts/${name}`),
      () => { forgetVhosts(); location.hash = '#/vhosts'; })) : null);

  async function refresh() {
    const v = await GET(p`/api/vhosts/${name}`);
    fill(summary, facts([
      ['Name', v.name],
      ['Description', v.description || undefined],
      ['Tags', (v.tags || []).length ? v.tags.map((t) => [badge(t, 'info'), ' ']) : undefined],
      // only where one was set: the node records a vhost without one as classic, the default
      ['Default queue type', v.default_queue_type && v.default_queue_type !== 'classic' ? v.default_queue_type : undefined],
      ['Messages', `${num(v.messages_ready)} ready, ${num(v.messages_unacknowledged)} unacked, ${num(v.messages)} total`],
      ['From clients', traffic(v, 'recv')],
      ['To clients', traffic(v, 'send')],
      ['State', v.cluster_state ? Object.entries(v.cluster_state).map(([node, s]) => `${node}: ${s}`).join(', ') : undefined],
    ]));
    await Promise.all([queues.refresh(), perms.refresh(), topics.refresh(), limits.refresh()]);
  }
  return {title: `Virtual host ${name}`, nav: 'admin', tab: 'vhosts', el, refresh, crumbs: [['Virtual hosts', '#/vhosts']]};
}
