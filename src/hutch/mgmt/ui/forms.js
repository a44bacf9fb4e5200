// Form building blocks: a form whose submit runs an async action and shows its outcome inline,
// a key/value editor for arguments, headers and policy definitions, and a virtual host picker.

import {GET} from './api.js';
import {fill, h, select, setOptions, uid} from './dom.js';

/**
 * A form that runs `action()` on submit. The outcome is shown under the button (a live region):
 * `action` returns a success message (or nothing), or throws (an ApiError is shown as it is).
 */
export function actionForm({label, fields, submit, action, className, danger = false}) {
  const outcome = h('p', {class: 'outcome', role: 'status', 'aria-live': 'polite'});
  const button = h('button', {type: 'submit', class: danger ? 'danger' : 'primary'}, submit);
  const form = h('form', {class: ['form', className], 'aria-label': label, novalidate: true}, fields,
    h('div', {class: 'actions'}, button), outcome);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    button.disabled = true;
    outcome.className = 'outcome';
    outcome.textContent = 'Working…';
    try {
      const message = await action(form);
      outcome.className = 'outcome ok';
      outcome.textContent = message || 'Done.';
    } catch (exc) {
      outcome.className = 'outcome error';
      outcome.textContent = exc.describe ? exc.describe() : String(exc.message || exc);
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

/** Raise an error shown in a form's outcome line (for checks before calling the API). */
export function invalid(message) {
  throw new Error(message);
}

const TYPES = [['string', 'String'], ['number', 'Number'], ['boolean', 'Boolean'], ['json', 'JSON']];

function guessType(value) {
  if (typeof value === 'number') return 'number';
  if (typeof value === 'boolean') return 'boolean';
  if (typeof value === 'string') return 'string';
  return 'json';
}

/**
 * Key = value rows with a type each. `suggestions` are [key, type, help] shortcuts shown as buttons.
 * .value() returns an object, .reset() empties it. Nothing typed is dropped silently: .value() throws
 * (the form shows it) on a value that does not parse, on a value typed without a key, and on a key
 * left without a value (an empty string is written as the JSON "").
 */
export class KeyValueEditor {
  constructor({legend, suggestions = [], keyLabel = 'Key', valueLabel = 'Value'}) {
    this.keyLabel = keyLabel;
    this.valueLabel = valueLabel;
    this.rows = h('div', {class: 'kv-rows'});
    const shortcuts = suggestions.length ? h('div', {class: 'kv-suggest'}, h('span', {}, 'Add:'),
      suggestions.map(([key, type, help]) => h('button', {type: 'button', class: 'link', title: help,
        onclick: () => this.add(key, type)}, key))) : null;
    this.el = h('fieldset', {class: 'kv'}, h('legend', {}, legend), this.rows, shortcuts);
    this.reset();
  }

  row(key = '', value = '', type = 'string') {
    const k = h('input', {type: 'text', value: key, 'aria-label': this.keyLabel, placeholder: this.keyLabel.toLowerCase(),
      autocomplete: 'off', spellcheck: 'false'});
    const v = h('input', {type: 'text', value, 'aria-label': this.valueLabel, placeholder: this.valueLabel.toLowerCase(),
      autocomplete: 'off', spellcheck: 'false'});
    const t = select(TYPES, {'aria-label': 'Type', value: type});
    const remove = h('button', {type: 'button', class: 'link', 'aria-label': 'Remove this row', title: 'Remove'}, '×');
    const row = h('div', {class: 'kv-row'}, k, h('span', {'aria-hidden': 'true'}, '='), v, t, remove);
    remove.addEventListener('click', () => { row.remove(); this.ensureBlank(); });
    k.addEventListener('input', () => this.ensureBlank());
    return row;
  }

  ensureBlank() {
    const rows = [...this.rows.children];
    if (!rows.length || rows[rows.length - 1].querySelector('input').value !== '') this.rows.append(this.row());
  }

  add(key, type = 'string', value = '') {
    const blank = [...this.rows.children].find((r) => r.querySelector('input').value === '');
    const row = this.row(key, value, type);
    if (blank) blank.replaceWith(row);
    else this.rows.append(row);
    this.ensureBlank();
    row.querySelectorAll('input')[1].focus();
  }

  set(obj) {
    fill(this.rows, Object.entries(obj || {}).map(([k, v]) =>
      this.row(k, typeof v === 'string' ? v : JSON.stringify(v), guessType(v))));
    this.ensureBlank();
  }

  reset() {
    this.set({});
  }

  value() {
    const out = {};
    for (const row of this.rows.children) {
      const [k, v] = row.querySelectorAll('input');
      const type = row.querySelector('select').value;
      const key = k.value.trim();
      const text = v.value;
      if (!key) {
        if (text.trim() !== '') throw new Error(`"${text}" has no ${this.keyLabel.toLowerCase()}: give one, or clear the value`);
        continue;
      }
      if (key in out) throw new Error(`${key} is given twice`);
      if (text === '') {
        throw new Error(`${key} has no value: give one, or remove the row (×); for an empty string pick JSON and write ""`);
      }
      if (type === 'string') out[key] = text;
      else if (type === 'number') {
        const n = Number(text);
        if (text.trim() === '' || !Number.isFinite(n)) throw new Error(`${key}: "${text}" is not a number`);
        out[key] = n;
      } else if (type === 'boolean') {
        if (!['true', 'false'].includes(text.trim().toLowerCase())) throw new Error(`${key}: write true or false`);
        out[key] = text.trim().toLowerCase() === 'true';
      } else {
        try {
          out[key] = JSON.parse(text);
        } catch {
          throw new Error(`${key}: "${text}" is not valid JSON`);
        }
      }
    }
    return out;
  }
}

let vhostCache = null;

/** The names of the virtual hosts the user can see (cached for a few seconds). */
export async function vhostNames() {
  if (!vhostCache || Date.now() - vhostCache.at > 5000) {
    const list = await GET('/api/vhosts?columns=name');
    vhostCache = {at: Date.now(), names: list.map((v) => v.name)};
  }
  return vhostCache.names;
}

export function forgetVhosts() {
  vhostCache = null;
}

/** A <select> of virtual hosts, filled asynchronously; `preferred` is picked when present. */
export function vhostSelect(preferred = '/') {
  const el = select([[preferred, preferred]], {id: uid('vhost'), value: preferred});
  vhostNames().then((names) => setOptions(el, names.length ? names : [preferred], preferred)).catch(() => {});
  return el;
}

/** A text input with the given attributes. */
export function input(attrs = {}) {
  return h('input', {type: 'text', autocomplete: 'off', spellcheck: 'false', ...attrs});
}
