// DOM helpers. Everything the UI shows is built with these, never with innerHTML, so names coming
// from the broker (queue names, client properties, message payloads) are always text.

/** h('a', {href: '#/x', class: 'c', onclick: fn}, 'text', child, [more]) -> Element */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else if (key === 'class') {
      el.className = Array.isArray(value) ? value.filter(Boolean).join(' ') : value;
    } else if (key === 'dataset') {
      Object.assign(el.dataset, value);
    } else if (key === 'value' || key === 'checked' || key === 'selected') {
      el[key] = value;
    } else {
      el.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

/** Replace the children of `el`. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

let nextId = 0;
/** A unique element id, for label/for and aria-describedby. */
export function uid(prefix = 'f') {
  nextId += 1;
  return `${prefix}-${nextId}`;
}

/** A labelled form field: <div class="field"><label for>…</label>control<small>hint</small></div>. */
export function field(label, control, hint) {
  const id = control.id || uid();
  control.id = id;
  const hintEl = hint ? h('small', {id: id + '-hint', class: 'hint'}, hint) : null;
  if (hintEl) control.setAttribute('aria-describedby', hintEl.id);
  return h('div', {class: 'field'}, h('label', {for: id}, label), control, hintEl);
}

/** A checkbox with its label on the right. */
export function checkbox(label, attrs = {}) {
  const id = uid('cb');
  const input = h('input', {type: 'checkbox', id, ...attrs});
  return {input, el: h('div', {class: 'field check'}, input, h('label', {for: id}, label))};
}

/** <select> from [[value, label], ...] or [value, ...]. */
export function select(options, attrs = {}) {
  const el = h('select', attrs);
  setOptions(el, options, attrs.value);
  return el;
}

export function setOptions(el, options, selected) {
  const keep = selected !== undefined ? selected : el.value;
  fill(el, options.map((o) => {
    const [value, label] = Array.isArray(o) ? o : [o, o];
    return h('option', {value}, label);
  }));
  if ([...el.options].some((o) => o.value === keep)) el.value = keep;
}

/** A small badge: kind is one of ok, warn, bad, info, muted. */
export function badge(text, kind = 'muted', title) {
  return h('span', {class: `badge ${kind}`, title}, text);
}

/** A definition list from [[term, value], ...], skipping undefined values. */
export function facts(pairs) {
  return h('dl', {class: 'facts'}, pairs.filter(([, v]) => v !== undefined).map(([k, v]) => [
    h('dt', {}, k), h('dd', {}, v === null || v === '' ? '—' : v),
  ]));
}

/** A section with a heading. */
export function section(title, ...children) {
  const id = uid('sec');
  return h('section', {class: 'panel', 'aria-labelledby': id}, h('h2', {id}, title), ...children);
}

/** Show a transient message in the toast area (announced to screen readers). */
export function toast(text, kind = 'ok') {
  const box = document.getElementById('toasts');
  const el = h('div', {class: `toast ${kind}`}, text);
  box.append(el);
  while (box.children.length > 3) box.firstChild.remove();
  setTimeout(() => el.remove(), kind === 'error' ? 9000 : 4000);
}

/** A modal confirmation (native <dialog>); resolves to true when confirmed. */
export function confirmDialog(message, action = 'Confirm', danger = true) {
  return new Promise((resolve) => {
    const dialog = h('dialog', {class: 'confirm', 'aria-label': 'Please confirm'});
    const done = (value) => { dialog.close(); dialog.remove(); resolve(value); };
    fill(dialog,
      h('p', {}, message),
      h('div', {class: 'actions'},
        h('button', {type: 'button', class: 'secondary', onclick: () => done(false)}, 'Cancel'),
        h('button', {type: 'button', class: danger ? 'danger' : 'primary', onclick: () => done(true)}, action)));
    dialog.addEventListener('cancel', (e) => { e.preventDefault(); done(false); });
    document.body.append(dialog);
    dialog.showModal();
  });
}

/** A link to a route: link('#/queues/%2F/q', 'q'). */
export function link(href, text, attrs = {}) {
  return h('a', {href, ...attrs}, text);
}
