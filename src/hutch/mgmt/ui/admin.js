// Admin pages: #/users, #/vhosts, #/permissions, #/policies. Each is a table with a delete action per
// row and a form to add (or update) one. (Limits and the user and vhost pages: accounts.js.)

import {DELETE, GET, hasTag, p, PUT, session} from './api.js';
import {traffic} from './clients.js';
import {keyValues, userHref, vhostHref} from './common.js';
import {badge, confirmDialog, field, h, link, select, toast} from './dom.js';
import {actionForm, forgetVhosts, input, KeyValueEditor, vhostSelect} from './forms.js';
import {withCounterRates} from './series.js';
import {clientList, DataTable} from './table.js';

export const ADMIN_TABS = [
  ['users', 'Users', '#/users'],
  ['vhosts', 'Virtual hosts', '#/vhosts'],
  ['permissions', 'Permissions', '#/permissions'],
  ['policies', 'Policies', '#/policies'],
  ['limits', 'Limits', '#/limits'],
];

/** The confirmation text for deleting user `name`: specific when it is the user logged in here. */
export function userDeleteWarning(name) {
  const s = session();
  return s && s.name === name
    ? `Delete user '${name}'? You are logged in as '${name}': your session ends at once, its connections ` +
      'are closed, and you cannot log in again as this user.'
    : `Delete user '${name}'? Its connections are closed.`;
}

/** A button that asks `question` (default "Delete {what}?"), then runs `run` and `after`. */
export function deleteButton(what, run, after, question, verb = 'Delete') {
  return h('button', {type: 'button', class: 'secondary small', onclick: async () => {
    if (!(await confirmDialog(question || `${verb} ${what}?`, verb))) return;
    try {
      await run();
      toast(`${verb === 'Delete' ? 'Deleted' : verb + 'ed'} ${what}.`);
    } catch (exc) {
      toast(exc.describe ? exc.describe() : String(exc), 'error');
    }
    after();
  }}, verb);
}

function addPanel(title, form) {
  return h('details', {class: 'panel add', open: true}, h('summary', {}, title), form);
}

// -- users ------------------------------------------------------------------------------------------

const TAGS = [
  ['administrator', 'everything, including users, virtual hosts and permissions'],
  ['monitoring', 'read everything: all connections, channels and node figures'],
  ['policymaker', 'manage policies in its virtual hosts'],
  ['management', 'use the management UI and API for its virtual hosts'],
];

export function usersPage() {
  const load = async () => {
    const [users, perms] = await Promise.all([GET('/api/users'), GET('/api/permissions').catch(() => [])]);
    const access = new Map();
    for (const e of perms) access.set(e.user, [...(access.get(e.user) || []), e.vhost]);
    return users.map((u) => ({...u, tags: Array.isArray(u.tags) ? u.tags.join(', ') : u.tags,
      vhosts: (access.get(u.name) || []).join(', ')}));
  };
  const table = new DataTable({
    noun: 'user', sort: 'name', load: clientList(load, ['name', 'tags']),
    columns: [
      {label: 'Name', key: 'name', render: (u) => link(userHref(u.name), u.name)},
      {label: 'Tags', key: 'tags', render: (u) => (u.tags ? u.tags.split(', ').map((t) => [badge(t, 'info'), ' ']) : h('span', {class: 'muted'}, 'none (cannot log in here)'))},
      {label: 'Can access virtual hosts', key: 'vhosts', render: (u) => u.vhosts || h('span', {class: 'muted'}, 'no access')},
      {label: 'Password', key: 'password_hash', render: (u) => (u.password_hash ? 'set' : h('span', {class: 'muted'}, 'none'))},
      {label: 'Action', sort: false, render: (u) => deleteButton(`user '${u.name}'`,
        () => DELETE(p`/api/users/${u.name}`), () => table.refresh(), userDeleteWarning(u.name))},
    ],
  });
  const name = input({autocomplete: 'off'});
  const password = input({type: 'password', autocomplete: 'new-password'});
  const again = input({type: 'password', autocomplete: 'new-password'});
  const tags = input({placeholder: 'e.g. administrator'});
  const tagList = h('dl', {class: 'tag-list'}, [...TAGS, ['', 'no tags: AMQP only, no access to this UI']].map(([t, help]) => [
    h('dt', {}, h('button', {type: 'button', class: 'link', onclick: () => { tags.value = t; }}, t || 'none')),
    h('dd', {}, help)]));
  const form = actionForm({
    label: 'Add or update a user', submit: 'Add / update user',
    fields: [h('div', {class: 'row'}, field('Username', name), field('Password', password),
      field('Password (again)', again), field('Tags', tags, 'Comma-separated; click one below to set it.')), tagList],
    async action() {
      if (!name.value) throw new Error('Give a username.');
      if (password.value !== again.value) throw new Error('The two passwords differ.');
      if (!password.value) throw new Error('Give a password.');
      await PUT(p`/api/users/${name.value}`, {password: password.value, tags: tags.value});
      const done = name.value;
      name.value = password.value = again.value = '';
      table.refresh();
      return `User '${done}' saved. Give it permissions on a virtual host (Permissions) so it can use one.`;
    },
  });
  return {title: 'Users', nav: 'admin', tab: 'users', el: h('div', {}, table.el, addPanel('Add or update a user', form)),
    refresh: () => table.refresh()};
}

// -- virtual hosts ----------------------------------------------------------------------------------

export function vhostsPage() {
  const table = new DataTable({
    noun: 'virtual host', sort: 'name',
    load: withCounterRates(clientList(() => GET('/api/vhosts'), ['name', 'description']), (v) => v.name,
      ['recv_oct', 'send_oct']),
    columns: [
      {label: 'Name', key: 'name', render: (v) => link(vhostHref(v.name), v.name)},
      {label: 'Description', key: 'description'},
      {label: 'Tags', key: 'tags', render: (v) => (v.tags || []).map((t) => [badge(t, 'info'), ' '])},
      {label: 'Default queue type', key: 'default_queue_type'},
      {label: 'Ready', key: 'messages_ready', num: true},
      {label: 'Unacked', key: 'messages_unacknowledged', num: true},
      {label: 'Total', key: 'messages', num: true},
      {label: 'From clients', key: 'recv_oct_details.rate', num: true, render: (v) => traffic(v, 'recv'),
        title: 'bytes per second received from the clients of this virtual host (under it: the total of its open connections)'},
      {label: 'To clients', key: 'send_oct_details.rate', num: true, render: (v) => traffic(v, 'send'),
        title: 'bytes per second sent to the clients of this virtual host (under it: the total of its open connections)'},
      {label: 'Action', sort: false, render: (v) => deleteButton(`virtual host '${v.name}' and everything in it`,
        () => DELETE(p`/api/vhosts/${v.name}`), () => { forgetVhosts(); table.refresh(); })},
    ],
  });
  const name = input();
  const description = input();
  const tags = input({placeholder: 'comma-separated'});
  const qtype = select([['classic', 'Classic'], ['quorum', 'Quorum'], ['stream', 'Stream']]);
  const form = actionForm({
    label: 'Add a virtual host', submit: 'Add virtual host',
    fields: [h('div', {class: 'row'}, field('Name', name), field('Description', description), field('Tags', tags),
      field('Default queue type', qtype))],
    async action() {
      if (!name.value) throw new Error('Give the virtual host a name.');
      await PUT(p`/api/vhosts/${name.value}`, {description: description.value, tags: tags.value,
        default_queue_type: qtype.value});
      const done = name.value;
      name.value = description.value = tags.value = '';
      forgetVhosts();
      table.refresh();
      return `Virtual host '${done}' added; you have full permissions on it.`;
    },
  });
  return {title: 'Virtual hosts', nav: 'admin', tab: 'vhosts',
    el: h('div', {}, table.el, addPanel('Add a virtual host', form)), refresh: () => table.refresh()};
}

// -- permissions ------------------------------------------------------------------------------------

export function permissionsPage() {
  const table = new DataTable({
    noun: 'permission', sort: 'user', load: clientList(() => GET('/api/permissions'), ['user', 'vhost']),
    columns: [
      {label: 'User', key: 'user'},
      {label: 'Virtual host', key: 'vhost'},
      {label: 'Configure', key: 'configure', render: (e) => h('code', {}, e.configure)},
      {label: 'Write', key: 'write', render: (e) => h('code', {}, e.write)},
      {label: 'Read', key: 'read', render: (e) => h('code', {}, e.read)},
      {label: 'Action', sort: false, render: (e) => deleteButton(`the permissions of '${e.user}' on '${e.vhost}'`,
        () => DELETE(p`/api/permissions/${e.vhost}/${e.user}`), () => table.refresh())},
    ],
  });
  const user = select([]);
  GET('/api/users?columns=name').then((list) => {
    for (const u of list) user.append(h('option', {value: u.name}, u.name));
  }).catch(() => {});
  const vh = vhostSelect('/');
  const configure = input({value: '.*'});
  const write = input({value: '.*'});
  const read = input({value: '.*'});
  const form = actionForm({
    label: 'Set permissions', submit: 'Set permissions',
    fields: [h('div', {class: 'row'}, field('User', user), field('Virtual host', vh), field('Configure regexp', configure),
      field('Write regexp', write), field('Read regexp', read)),
    h('p', {class: 'hint'}, 'Regular expressions over resource names: configure = declare and delete, ' +
      'write = publish to exchanges and bind, read = consume, get and purge. ".*" allows all, "" nothing.')],
    async action() {
      if (!user.value) throw new Error('Pick a user.');
      await PUT(p`/api/permissions/${vh.value}/${user.value}`,
        {configure: configure.value, write: write.value, read: read.value});
      table.refresh();
      return `Permissions of '${user.value}' on '${vh.value}' set.`;
    },
  });
  return {title: 'Permissions', nav: 'admin', tab: 'permissions',
    el: h('div', {}, table.el, addPanel('Set permissions', form)), refresh: () => table.refresh()};
}

// -- policies ---------------------------------------------------------------------------------------

const POLICY_KEYS = [
  ['max-length', 'number', 'ready messages a queue keeps at most'],
  ['max-length-bytes', 'number', 'total body bytes a queue keeps at most'],
  ['overflow', 'string', 'drop-head, reject-publish or reject-publish-dlx'],
  ['message-ttl', 'number', 'message time to live, milliseconds'],
  ['expires', 'number', 'delete an unused queue after this many milliseconds'],
  ['dead-letter-exchange', 'string', 'where rejected and expired messages go'],
  ['dead-letter-routing-key', 'string', 'routing key of dead-lettered messages'],
  ['delivery-limit', 'number', 'deliveries before a message is dead-lettered or dropped'],
  ['max-priority', 'number', 'highest message priority'],
  ['alternate-exchange', 'string', 'exchanges: where unroutable messages go'],
];
const APPLY_TO = [['all', 'Exchanges and queues'], ['queues', 'Queues'], ['classic_queues', 'Classic queues'],
  ['quorum_queues', 'Quorum queues'], ['streams', 'Streams'], ['exchanges', 'Exchanges']];

function policyTable(kind, path, vhost) {
  const table = new DataTable({
    noun: kind === 'operator' ? 'operator policy' : 'policy', plural: kind === 'operator' ? 'operator policies' : 'policies',
    sort: 'priority', reverse: true,
    load: clientList(() => GET(vhost ? `${path}/${encodeURIComponent(vhost)}` : path), ['name', 'pattern']),
    columns: [
      {label: 'Name', key: 'name'},
      {label: 'Virtual host', key: 'vhost'},
      {label: 'Pattern', key: 'pattern', render: (x) => h('code', {}, x.pattern)},
      {label: 'Apply to', key: 'apply-to'},
      {label: 'Definition', sort: false, render: (x) => keyValues(x.definition)},
      {label: 'Priority', key: 'priority', num: true},
      {label: 'Action', sort: false, render: (x) => deleteButton(`policy '${x.name}'`,
        () => DELETE(`${path}/${encodeURIComponent(x.vhost)}/${encodeURIComponent(x.name)}`), () => table.refresh())},
    ],
  });
  return table;
}

export function policiesPage(ctx) {
  const operator = hasTag('administrator');
  const userPolicies = policyTable('user', '/api/policies', ctx.vhost);
  const operatorPolicies = operator ? policyTable('operator', '/api/operator-policies', ctx.vhost) : null;
  const kind = select([['/api/policies', 'Policy'], ['/api/operator-policies', 'Operator policy']]);
  const vh = vhostSelect(ctx.vhost || '/');
  const name = input();
  const pattern = input({placeholder: 'e.g. ^orders\\.'});
  const applyTo = select(APPLY_TO);
  const priority = input({type: 'number', value: '0', inputmode: 'numeric'});
  const definition = new KeyValueEditor({legend: 'Definition', suggestions: POLICY_KEYS});
  const form = actionForm({
    label: 'Add or update a policy', submit: 'Add / update policy',
    fields: [h('div', {class: 'row'}, operator ? field('Kind', kind, 'Operator policies cap what users\' policies set.') : null, field('Virtual host', vh), field('Name', name),
      field('Pattern', pattern, 'A regular expression matched against queue and exchange names.'),
      field('Apply to', applyTo), field('Priority', priority)), definition.el],
    async action() {
      if (!name.value) throw new Error('Give the policy a name.');
      if (!pattern.value) throw new Error('Give a pattern ("^" matches every name).');
      const def = definition.value();
      if (!Object.keys(def).length) throw new Error('Give at least one definition key, e.g. max-length.');
      await PUT(`${kind.value}/${encodeURIComponent(vh.value)}/${encodeURIComponent(name.value)}`,
        {pattern: pattern.value, definition: def, priority: Number(priority.value) || 0, 'apply-to': applyTo.value});
      const done = name.value;
      name.value = pattern.value = '';
      definition.reset();
      userPolicies.refresh();
      if (operatorPolicies) operatorPolicies.refresh();
      return `Policy '${done}' saved in virtual host '${vh.value}'.`;
    },
  });
  const el = h('div', {}, userPolicies.el,
    operatorPolicies ? [h('h2', {class: 'sub'}, 'Operator policies'), operatorPolicies.el] : null,
    addPanel('Add or update a policy', form));
  return {title: 'Policies', nav: 'admin', tab: 'policies', el, vhostScoped: true,
    refresh: () => Promise.all([userPolicies.refresh(), operatorPolicies && operatorPolicies.refresh()])};
}
