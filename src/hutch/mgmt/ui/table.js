// Data tables: sortable column headers, a name filter (substring or regular expression), pagination.
// Two sources: `serverList(path)` pages, sorts and filters on the server (RabbitMQ's page, page_size,
// name, use_regex, sort, sort_reverse parameters: queues, exchanges, connections, channels), and
// `clientList(fetchAll)` does the same in the browser for short lists (users, policies, ...).
// Only the table body and the pager are re-rendered on refresh, so the filter box keeps focus.

import {api, qs} from './api.js';
import {fill, h, select, uid} from './dom.js';
import {get, num} from './fmt.js';

const PAGE_SIZES = [20, 50, 100, 500];

/** Server-side listing: GET path?page=…; returns {items, filtered, total, pages}. */
export function serverList(path) {
  return async (state) => {
    const reply = await api('GET', path + qs({
      page: state.page, page_size: state.pageSize, name: state.filter,
      use_regex: state.regex && state.filter ? 'true' : '', sort: state.sort,
      sort_reverse: state.sort ? String(state.reverse) : '',
    }));
    if (Array.isArray(reply)) return clientPage(reply, state, ['name']);  // a server without pagination
    return {items: reply.items, filtered: reply.filtered_count, total: reply.total_count,
      pages: Math.max(1, reply.page_count)};
  };
}

/** All of `path` (server-side), or only the items of `vhost` (filtered here: for lists that have no
 * per-vhost path, such as connections and channels). */
export function vhostList(path, vhost) {
  if (!vhost) return serverList(path);
  return clientList(async () => (await api('GET', path)).filter((item) => item.vhost === vhost));
}

/** Client-side listing over the whole list `fetchAll()` returns; filters on `filterKeys`. */
export function clientList(fetchAll, filterKeys = ['name']) {
  return async (state) => clientPage(await fetchAll(), state, filterKeys);
}

function compare(a, b) {
  if (a === b) return 0;
  if (a === undefined || a === null) return -1;
  if (b === undefined || b === null) return 1;
  if (typeof a === 'number' && typeof b === 'number') return a - b;
  return String(a).localeCompare(String(b), undefined, {numeric: true, sensitivity: 'base'});
}

function clientPage(all, state, filterKeys) {
  let rows = all;
  if (state.filter) {
    let test;
    if (state.regex) {
      let re;
      try {
        re = new RegExp(state.filter, 'i');
      } catch (exc) {
        throw new Error(`Invalid regular expression: ${exc.message}`);
      }
      test = (s) => re.test(s);
    } else {
      const needle = state.filter.toLowerCase();
      test = (s) => s.toLowerCase().includes(needle);
    }
    rows = rows.filter((r) => filterKeys.some((k) => test(String(get(r, k) ?? ''))));
  }
  if (state.sort) {
    rows = [...rows].sort((a, b) => compare(get(a, state.sort), get(b, state.sort)));
    if (state.reverse) rows.reverse();
  }
  const pages = Math.max(1, Math.ceil(rows.length / state.pageSize));
  const page = Math.min(state.page, pages);
  state.page = page;
  return {items: rows.slice((page - 1) * state.pageSize, page * state.pageSize), filtered: rows.length,
    total: all.length, pages};
}

/**
 * A table.
 *   columns: [{label, key?, sort?: field|false, num?: bool, nowrap?: bool, render?: (row) => node|string, title?}]
 *   load: serverList(...) or clientList(...)
 *   noun: 'queue', plural ('queues' by default): "3 queues"; empty: text when there are no rows
 *   filter: false to hide the filter box; pageSize: initial page size
 */
export class DataTable {
  constructor({columns, load, noun = 'item', plural, empty, filter = true, pageSize = 20, sort, reverse = false,
    label, rowClass}) {
    this.columns = columns;
    this.load = load;
    this.noun = noun;
    this.plural = plural || `${noun}s`;
    this.empty = empty || `No ${this.plural}.`;
    this.rowClass = rowClass;
    this.state = {page: 1, pageSize, filter: '', regex: false, sort: sort || '', reverse};
    this.tbody = h('tbody');
    this.count = h('span', {class: 'count', 'aria-live': 'polite'});
    this.pager = h('nav', {class: 'pager', 'aria-label': `${noun} pages`});
    this.error = h('p', {class: 'notice error', role: 'alert', hidden: true});
    this.headRow = h('tr', {}, columns.map((c) => this.header(c)));
    const controls = [];
    if (filter) {
      const box = h('input', {type: 'search', id: uid('filter'), placeholder: 'name contains…',
        autocomplete: 'off', spellcheck: 'false'});
      let timer = null;
      box.addEventListener('input', () => {
        clearTimeout(timer);
        timer = setTimeout(() => { this.state.filter = box.value.trim(); this.state.page = 1; this.refresh(); }, 250);
      });
      const regexId = uid('re');
      const regex = h('input', {type: 'checkbox', id: regexId, onchange: (e) => {
        this.state.regex = e.target.checked; this.state.page = 1; this.refresh();
      }});
      controls.push(h('label', {for: box.id}, 'Filter'), box,
        h('span', {class: 'check'}, regex, h('label', {for: regexId}, 'Regex')));
    }
    const sizeId = uid('size');
    const size = select(PAGE_SIZES.map((n) => [String(n), String(n)]), {id: sizeId, value: String(pageSize),
      onchange: (e) => { this.state.pageSize = Number(e.target.value); this.state.page = 1; this.refresh(); }});
    controls.push(h('span', {class: 'spacer'}), this.count, h('label', {for: sizeId}, 'Per page'), size);
    this.table = h('table', {class: 'data', 'aria-label': label || this.plural},
      h('thead', {}, this.headRow), this.tbody);
    this.el = h('div', {class: 'datatable'}, h('div', {class: 'table-controls'}, controls), this.error,
      h('div', {class: 'table-scroll'}, this.table), this.pager);
    this.updateHeaders();
  }

  header(c) {
    const th = h('th', {scope: 'col', class: c.num ? 'num' : null, title: c.title});
    const field = c.sort === false ? null : (c.sort || c.key);
    if (!field) {
      th.append(c.label);
      return th;
    }
    th.dataset.sort = field;
    th.append(h('button', {type: 'button', class: 'sort', onclick: () => {
      if (this.state.sort === field) this.state.reverse = !this.state.reverse;
      else { this.state.sort = field; this.state.reverse = Boolean(c.num); }
      this.updateHeaders();
      this.refresh();
    }}, c.label, h('span', {class: 'arrow', 'aria-hidden': 'true'})));
    return th;
  }

  updateHeaders() {
    for (const th of this.headRow.children) {
      const active = th.dataset.sort && th.dataset.sort === this.state.sort;
      if (th.dataset.sort) th.setAttribute('aria-sort', active ? (this.state.reverse ? 'descending' : 'ascending') : 'none');
      const arrow = th.querySelector('.arrow');
      if (arrow) arrow.textContent = active ? (this.state.reverse ? ' ▼' : ' ▲') : '';
    }
  }

  async refresh() {
    let result;
    try {
      result = await this.load(this.state);
    } catch (exc) {
      this.error.hidden = false;
      this.error.textContent = exc.describe ? exc.describe() : String(exc.message || exc);
      return;
    }
    this.error.hidden = true;
    if (result.pages < this.state.page) {
      this.state.page = result.pages;
      return this.refresh();
    }
    this.render(result);
  }

  render({items, filtered, total, pages}) {
    const rows = items.map((row) => h('tr', {class: this.rowClass ? this.rowClass(row) : null},
      this.columns.map((c, i) => {
        const content = c.render ? c.render(row) : (c.num ? num(get(row, c.key)) : get(row, c.key));
        const attrs = {class: [c.num ? 'num' : null, c.nowrap ? 'nowrap' : null]};
        return i === 0 ? h('th', {scope: 'row', ...attrs}, content) : h('td', attrs, content);
      })));
    if (!rows.length) {
      rows.push(h('tr', {}, h('td', {colspan: this.columns.length, class: 'empty'},
        total ? `No ${this.plural} match the filter.` : this.empty)));
    }
    fill(this.tbody, rows);
    const plural = (n) => `${num(n)} ${n === 1 ? this.noun : this.plural}`;
    this.count.textContent = filtered === total ? plural(total) : `${plural(filtered)} of ${num(total)}`;
    const s = this.state;
    const go = (page) => { s.page = page; this.refresh(); };
    fill(this.pager, pages > 1 ? [
      h('button', {type: 'button', class: 'secondary', disabled: s.page <= 1, onclick: () => go(s.page - 1)}, '‹ Previous'),
      h('span', {}, `Page ${s.page} of ${pages}`),
      h('button', {type: 'button', class: 'secondary', disabled: s.page >= pages, onclick: () => go(s.page + 1)}, 'Next ›'),
    ] : []);
  }
}
