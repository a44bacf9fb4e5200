// Number, size, rate and time formatting.

const integer = new Intl.NumberFormat('en-US', {maximumFractionDigits: 0});
const decimal = new Intl.NumberFormat('en-US', {maximumFractionDigits: 1, minimumFractionDigits: 0});

export function num(value) {
  return typeof value === 'number' && Number.isFinite(value) ? integer.format(value) : '—';
}

const hundredths = new Intl.NumberFormat('en-US', {maximumFractionDigits: 2, minimumFractionDigits: 2});

/** A per-second rate: "1,235/s", "12.3/s", "0.04/s" (two decimals below 1/s), "<0.01/s"; "0/s" for
 * zero, "—" when the server gave none. */
export function rate(value) {
  if (typeof value !== 'number' || !Number.isFinite(value)) return '—';
  if (value === 0) return '0/s';
  if (value < 0.005) return '<0.01/s';
  if (value < 1) return hundredths.format(value) + '/s';
  return (value >= 100 ? integer.format(value) : decimal.format(value)) + '/s';
}

/** Bytes per second: "1.5 KiB/s". */
export function byteRate(value) {
  return typeof value === 'number' && Number.isFinite(value) ? bytes(value) + '/s' : '—';
}

/** obj.a.b.c, or undefined. */
export function get(obj, dotted) {
  let value = obj;
  for (const key of dotted.split('.')) {
    if (value === null || value === undefined) return undefined;
    value = value[key];
  }
  return value;
}

/** The `rate` of `message_stats.<name>_details` (or of another `<stats>.<name>_details`). */
export function statRate(obj, name, stats = 'message_stats') {
  return get(obj, `${stats}.${name}_details.rate`);
}

export function bytes(value) {
  if (typeof value !== 'number' || !Number.isFinite(value)) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let v = value;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return (i === 0 ? integer.format(v) : decimal.format(v)) + ' ' + units[i];
}

/** Milliseconds as "3d 4h", "2h 5m", "4m 12s", "9s". */
export function duration(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms)) return '—';
  let s = Math.max(0, Math.floor(ms / 1000));
  const d = Math.floor(s / 86400); s -= d * 86400;
  const hr = Math.floor(s / 3600); s -= hr * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  if (d) return `${d}d ${hr}h`;
  if (hr) return `${hr}h ${m}m`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}

export function clock(ms) {
  const d = new Date(ms);
  return d.toLocaleTimeString('en-GB', {hour12: false});
}

/** "14:05": hours and minutes of a time in ms. */
export function hhmm(ms) {
  return new Date(ms).toLocaleTimeString('en-GB', {hour12: false, hour: '2-digit', minute: '2-digit'});
}

export function dateTime(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms)) return '—';
  const d = new Date(ms);
  const pad = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock(ms)}`;
}

/** A JSON value shown compactly: strings as they are, the rest as JSON. */
export function value(v) {
  if (v === null || v === undefined) return '';
  return typeof v === 'string' ? v : JSON.stringify(v);
}
