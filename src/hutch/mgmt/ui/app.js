// hutch management UI: the entry point. Owns the login form, the page frame (header, navigation,
// virtual host scope, refresh interval), hash routing and polling. Pages are functions
// (ctx, params) -> {title, nav, el, refresh(), destroy?()}: the frame builds a page once per
// navigation and calls its refresh() on every poll, so forms on a page keep what the user typed.
// When the node stops answering (every request has a timeout, api.js), the page's figures are greyed
// under "the node has not answered since HH:MM; figures are stale", until it answers again.

import {limitsPage, userPage, vhostPage} from './accounts.js';
import {ADMIN_TABS, permissionsPage, policiesPage, usersPage, vhostsPage} from './admin.js';
import {hasTag, lastAnswer, onReachability, session, setSignedOutHandler, signIn, signOut} from './api.js';
import {channelPage, channelsPage, connectionPage, connectionsPage} from './clients.js';
import {fill, h, select, setOptions, uid} from './dom.js';
import {exchangePage, exchangesPage} from './exchanges.js';
import {clock, hhmm} from './fmt.js';
import {vhostNames} from './forms.js';
import {nodesPage} from './nodes.js';
import {overviewPage} from './overview.js';
import {queuePage, queuesPage} from './queues.js';
import {federationPage, shovelsPage} from './shovels.js';
import {streamConnectionPage, streamConnectionsPage, streamPage, streamsPage} from './streams.js';

const ROUTES = [
  [/^\/overview$/, overviewPage],
  [/^\/connections$/, connectionsPage],
  [/^\/connections\/([^/]+)$/, connectionPage],
  [/^\/channels$/, channelsPage],
  [/^\/channels\/([^/]+)$/, channelPage],
  [/^\/exchanges$/, exchangesPage],
  [/^\/exchanges\/([^/]+)\/([^/]+)$/, exchangePage],
  [/^\/queues$/, queuesPage],
  [/^\/queues\/([^/]+)\/([^/]+)$/, queuePage],
  [/^\/streams$/, streamsPage],
  [/^\/streams\/([^/]+)\/([^/]+)$/, streamPage],
  [/^\/stream-connections$/, streamConnectionsPage],
  [/^\/stream-connections\/([^/]+)\/([^/]+)$/, streamConnectionPage],
  [/^\/users$/, usersPage],
  [/^\/users\/([^/]+)$/, userPage],
  [/^\/vhosts$/, vhostsPage],
  [/^\/vhosts\/([^/]+)$/, vhostPage],
  [/^\/limits$/, limitsPage],
  [/^\/permissions$/, permissionsPage],
  [/^\/policies$/, policiesPage],
  [/^\/nodes$/, nodesPage],
  [/^\/shovels$/, shovelsPage], [/^\/federation$/, federationPage],
];
const NAV = [
  ['overview', 'Overview', '#/overview'],
  ['connections', 'Connections', '#/connections'],
  ['channels', 'Channels', '#/channels'],
  ['exchanges', 'Exchanges', '#/exchanges'],
  ['queues', 'Queues', '#/queues'],
  ['streams', 'Streams', '#/streams'],
  ['admin', 'Admin', '#/users'],
  ['nodes', 'Nodes', '#/nodes'],
  ['shovels', 'Shovels', '#/shovels'], ['federation', 'Federation', '#/federation'],
];
const REFRESH_CHOICES = [['2000', 'every 2 s'], ['5000', 'every 5 s'], ['10000', 'every 10 s'],
  ['30000', 'every 30 s'], ['0', 'paused']];
const VHOST_KEY = 'hutch.vhost';
const REFRESH_KEY = 'hutch.refresh_ms';

const state = {page: null, timer: null, refreshMs: Number(localStorage.getItem(REFRESH_KEY) ?? 5000), stale: false};
const top = () => document.getElementById('top');
const main = () => document.getElementById('main');

// -- login ------------------------------------------------------------------------------------------

function showLogin(message) {
  stopPage();
  top().hidden = true;
  document.title = 'Log in - hutch';
  const user = h('input', {type: 'text', id: uid('user'), name: 'username', autocomplete: 'username', required: true,
    spellcheck: 'false'});
  const password = h('input', {type: 'password', id: uid('pw'), name: 'password', autocomplete: 'current-password'});
  const error = h('p', {class: 'notice error', role: 'alert', hidden: !message}, message || '');
  const button = h('button', {type: 'submit', class: 'primary'}, 'Log in');
  const form = h('form', {class: 'login', 'aria-labelledby': 'login-title'},
    h('h1', {id: 'login-title'}, h('span', {class: 'logo', 'aria-hidden': 'true'}), 'hutch'),
    h('p', {class: 'muted'}, 'Log in to manage this message broker.'),
    error,
    h('div', {class: 'field'}, h('label', {for: user.id}, 'Username'), user),
    h('div', {class: 'field'}, h('label', {for: password.id}, 'Password'), password),
    h('div', {class: 'actions'}, button));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    button.disabled = true;
    error.hidden = true;
    try {
      await signIn(user.value, password.value);
      showFrame();
    } catch (exc) {
      error.hidden = false;
      error.textContent = exc.status === 401
        ? (exc.error === 'not_authorised' ? `Login refused: ${exc.reason}.` : 'Login failed: wrong username or password.')
        : (exc.describe ? exc.describe() : String(exc));
    } finally {
      button.disabled = false;
    }
  });
  fill(main(), form);
  user.focus();
}

// -- the frame --------------------------------------------------------------------------------------

function navVisible(key) {
  if (key === 'admin') return hasTag('administrator', 'policymaker');
  if (key === 'nodes') return hasTag('administrator', 'monitoring');
  return true;
}

function showFrame() {
  const s = session();
  const vhost = select([['', 'All virtual hosts']], {id: 'vhost-scope', value: sessionStorage.getItem(VHOST_KEY) || '',
    title: 'Show the objects of this virtual host only'});
  vhostNames().then((names) => setOptions(vhost, [['', 'All virtual hosts'], ...names.map((n) => [n, n])],
    sessionStorage.getItem(VHOST_KEY) || '')).catch(() => {});
  vhost.addEventListener('change', () => {
    sessionStorage.setItem(VHOST_KEY, vhost.value);
    if (state.page && state.page.vhostScoped) route();
  });
  const refresh = select(REFRESH_CHOICES, {id: 'refresh-every', value: String(state.refreshMs), title: 'How often pages refresh'});
  refresh.addEventListener('change', () => {
    state.refreshMs = Number(refresh.value);
    localStorage.setItem(REFRESH_KEY, refresh.value);
    schedule();
  });
  const logout = h('button', {type: 'button', class: 'secondary small', onclick: () => {
    signOut();
    showLogin('You have logged out.');  // the address stays: logging in again returns to this page
  }}, 'Log out');
  // on a narrow screen the navigation and the session controls fold behind a "Menu" button (app.css)
  const menu = h('div', {class: 'menu', id: 'top-menu'},
    h('nav', {class: 'nav', 'aria-label': 'Main'}, h('ul', {}, NAV.filter(([k]) => navVisible(k)).map(([key, label, href]) =>
      h('li', {}, h('a', {href: key === 'admin' && !hasTag('administrator') ? '#/policies' : href, dataset: {nav: key}},
        label))))),
    h('div', {class: 'session'},
      h('label', {for: vhost.id}, 'Virtual host'), vhost,
      h('label', {for: refresh.id}, 'Refresh'), refresh,
      h('span', {class: 'who', title: `tags: ${s.tags.join(', ') || 'none'}`}, s.name),
      logout));
  const toggle = h('button', {type: 'button', class: 'menu-toggle secondary small', 'aria-expanded': 'false',
    'aria-controls': menu.id, onclick: () => setMenuOpen(toggle.getAttribute('aria-expanded') !== 'true')}, 'Menu');
  fill(top(),
    h('a', {class: 'brand', href: '#/overview'}, h('span', {class: 'logo', 'aria-hidden': 'true'}), 'hutch'),
    toggle, menu);
  top().hidden = false;
  route();
}

function setMenuOpen(open) {
  const toggle = top().querySelector('.menu-toggle');
  if (toggle) toggle.setAttribute('aria-expanded', String(open));
  top().classList.toggle('open', open);
}

function stopPage() {
  if (state.page && state.page.destroy) state.page.destroy();
  state.page = null;
  clearInterval(state.timer);
  state.timer = null;
}

function schedule() {
  clearInterval(state.timer);
  state.timer = state.refreshMs > 0 ? setInterval(() => {
    if (!document.hidden) refreshPage();
  }, state.refreshMs) : null;
}

async function refreshPage() {
  const page = state.page;
  if (!page || page.busy) return;  // a slow refresh is not stacked with the next one
  page.busy = true;
  const status = document.getElementById('page-status');
  const problem = document.getElementById('page-problem');
  try {
    await page.refresh();
    if (page === state.page && status) {
      status.textContent = `Updated ${clock(Date.now())}` + (state.refreshMs ? '' : ' (refresh paused)');
      problem.hidden = true;
    }
  } catch (exc) {
    if (exc.status === 0 && page === state.page && problem) {
      problem.hidden = true;  // the stale-node banner says it
    } else if (page === state.page && problem) {
      problem.hidden = false;
      problem.textContent = 'Could not load this page: ' + (exc.describe ? exc.describe() : String(exc.message || exc));
    }
  } finally {
    page.busy = false;
  }
}

/** Grey the figures and say since when the node has not answered; undo it when it answers again. */
function showReachability() {
  const banner = document.getElementById('node-stale');
  main().classList.toggle('stale', state.stale);
  if (!banner) return;
  banner.hidden = !state.stale;
  banner.textContent = state.stale
    ? `The node has not answered since ${hhmm(lastAnswer())}; the figures below are stale. ` +
      'The page keeps asking and clears this when the node answers again.'
    : '';
  const status = document.getElementById('page-status');
  if (status && state.stale) status.textContent = `Last answer ${clock(lastAnswer())}`;
}

onReachability((answering) => {
  state.stale = !answering;
  showReachability();
});

function route() {
  if (!session()) {
    showLogin();
    return;
  }
  const path = (location.hash || '#/overview').slice(1);
  let page = null;
  stopPage();
  setMenuOpen(false);
  const ctx = {vhost: sessionStorage.getItem(VHOST_KEY) || ''};
  for (const [pattern, make] of ROUTES) {
    const m = pattern.exec(path);
    if (m) {
      page = make(ctx, m.slice(1).map((part) => decodeURIComponent(part)));
      break;
    }
  }
  if (!page && (path === '' || path === '/')) {
    location.replace('#/overview');
    return;
  }
  page = page || {title: 'Page not found', nav: '', el: h('p', {}, 'There is no page at this address. ',
    h('a', {href: '#/overview'}, 'Go to the overview.')), refresh: async () => {}};
  state.page = page;
  for (const a of top().querySelectorAll('.nav a')) {
    if (a.dataset.nav === page.nav) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  document.title = `${page.title} - hutch`;
  const crumbs = page.crumbs ? h('nav', {class: 'crumbs', 'aria-label': 'Breadcrumb'},
    page.crumbs.map(([label, href], i) => [i ? ' › ' : null, href ? h('a', {href}, label) : h('span', {}, label)])) : null;
  const tabs = page.nav === 'admin' ? h('nav', {class: 'tabs', 'aria-label': 'Admin'},
    ADMIN_TABS.filter(([key]) => key === 'policies' || hasTag('administrator')).map(([key, label, href]) =>
      h('a', {href, 'aria-current': key === page.tab ? 'page' : null}, label))) : null;
  const scope = page.vhostScoped && ctx.vhost ? h('span', {class: 'scope'}, `in virtual host ${ctx.vhost}`) : null;
  fill(main(),
    tabs,
    h('div', {class: 'page-head'}, h('div', {}, crumbs, h('h1', {}, page.title, scope)),
      h('span', {id: 'page-status', class: 'muted small', 'aria-live': 'off'}, 'Loading…')),
    h('p', {id: 'node-stale', class: 'notice stale-note', role: 'alert', hidden: true}),
    h('p', {id: 'page-problem', class: 'notice error', role: 'alert', hidden: true}),
    h('div', {class: 'page-body'}, page.el));
  showReachability();
  main().focus({preventScroll: true});
  refreshPage();
  schedule();
}

setSignedOutHandler((message) => showLogin(message));
window.addEventListener('hashchange', () => route());
document.addEventListener('visibilitychange', () => {
  if (!document.hidden) refreshPage();
});
if (session()) showFrame();
else showLogin();
