// The HTTP API client: same origin, HTTP basic auth from sessionStorage, JSON in and out.
// Every failure is an ApiError carrying RabbitMQ's {error, reason} so pages can show it as it is.
// Every request has a timeout, and the client keeps track of whether the node answers: the frame
// shows "the node has not answered since HH:MM" while it does not (onReachability).

const STORAGE_KEY = 'hutch.session';
/** How long a read may take before it counts as "no answer"; changes (imports) get longer. */
export const READ_TIMEOUT_MS = 8000;
export const CHANGE_TIMEOUT_MS = 60000;
let onSignedOut = () => {};
const reach = {lastAnswer: Date.now(), failing: false, listeners: []};

/** fn(answering, lastAnswerMs) is called when the node stops answering and when it answers again. */
export function onReachability(fn) {
  reach.listeners.push(fn);
}

/** When the node last answered a request (any HTTP status counts as an answer). */
export function lastAnswer() {
  return reach.lastAnswer;
}

function reached(answered) {
  if (answered) reach.lastAnswer = Date.now();
  if (reach.failing === !answered) return;
  reach.failing = !answered;
  for (const fn of reach.listeners) fn(answered, reach.lastAnswer);
}

export class ApiError extends Error {
  constructor(status, error, reason, method, path) {
    super(status ? `${status} ${error}${reason && reason !== error ? ': ' + reason : ''}` : reason);
    this.status = status;
    this.error = error;
    this.reason = reason;
    this.method = method;
    this.path = path;
  }

  /** What to show a user: the request, the status and RabbitMQ's error and reason. */
  describe() {
    const what = this.status === 404 && this.error === 'Object Not Found'
      ? '404 not found (no such object, or an endpoint this version of hutch does not have)'
      : this.message;
    return `${this.method} ${this.path} failed: ${what}`;
  }
}

function base64(text) {
  const utf8 = new TextEncoder().encode(text);
  let binary = '';
  for (const b of utf8) binary += String.fromCharCode(b);
  return btoa(binary);
}

/** The signed-in session {auth, name, tags}, or null. */
export function session() {
  try {
    return JSON.parse(sessionStorage.getItem(STORAGE_KEY));
  } catch {
    return null;
  }
}

export function hasTag(...tags) {
  const s = session();
  return Boolean(s && s.tags.some((t) => tags.includes(t)));
}

/** Called when the server no longer accepts the stored credentials. */
export function setSignedOutHandler(fn) {
  onSignedOut = fn;
}

/** Check the credentials with GET /api/whoami and keep them for this browser tab. */
export async function signIn(name, password) {
  const auth = base64(`${name}:${password}`);
  const me = await request('GET', '/api/whoami', undefined, auth);
  const tags = Array.isArray(me.tags) ? me.tags : String(me.tags || '').split(',').filter(Boolean);
  sessionStorage.setItem(STORAGE_KEY, JSON.stringify({auth, name: me.name, tags}));
  return me;
}

export function signOut() {
  sessionStorage.removeItem(STORAGE_KEY);
}

async function request(method, path, body, auth) {
  const headers = {Accept: 'application/json'};
  if (auth) headers.Authorization = 'Basic ' + auth;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const limit = method === 'GET' ? READ_TIMEOUT_MS : CHANGE_TIMEOUT_MS;
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), limit);
  let response;
  let text;
  try {
    // credentials 'omit': the Authorization header is ours; a 401 must not open the browser's own
    // login prompt (the Fetch standard prompts only when credentials are included).
    response = await fetch(path, {
      method, headers, credentials: 'omit', cache: 'no-store', signal: abort.signal,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    text = await response.text();
  } catch (exc) {
    reached(false);
    if (abort.signal.aborted) {
      throw new ApiError(0, 'timeout', `no answer from the server within ${limit / 1000} s`, method, path);
    }
    throw new ApiError(0, 'network_error', `cannot reach the server (${exc.message})`, method, path);
  } finally {
    clearTimeout(timer);
  }
  reached(true);
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = text;
    }
  }
  if (!response.ok) {
    const error = data && typeof data === 'object' ? data.error : response.statusText;
    const reason = data && typeof data === 'object' ? data.reason : String(data || '');
    throw new ApiError(response.status, String(error || response.status), String(reason || ''), method, path);
  }
  return data;
}

/** An authenticated call. Credentials the server refuses sign the user out. */
export async function api(method, path, body) {
  const s = session();
  try {
    return await request(method, path, body, s ? s.auth : null);
  } catch (exc) {
    if (exc instanceof ApiError && exc.status === 401 && exc.error === 'not_authorized') {
      signOut();
      onSignedOut('Your session has ended: the server refused the stored credentials.');
    }
    throw exc;
  }
}

export const GET = (path) => api('GET', path);
export const PUT = (path, body) => api('PUT', path, body === undefined ? {} : body);
export const POST = (path, body) => api('POST', path, body === undefined ? {} : body);
export const DELETE = (path) => api('DELETE', path);

/** A path with percent-encoded segments: p`/api/queues/${vhost}/${name}`. */
export function p(strings, ...values) {
  return strings.reduce((out, s, i) => out + s + (i < values.length ? encodeURIComponent(values[i]) : ''), '');
}

/** A query string from an object, skipping empty values. */
export function qs(params) {
  const parts = Object.entries(params)
    .filter(([, v]) => v !== undefined && v !== null && v !== '')
    .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`);
  return parts.length ? '?' + parts.join('&') : '';
}
