// Turning API replies into chart samples: rates from `*_details.rate` (or, when a server gives
// none, from the change of the counters between two polls), and seeding a History from the
// `samples` RabbitMQ returns for ?lengths_age=…&msg_rates_age=… requests.

import {get} from './fmt.js';

/** Rates of cumulative counters: the server's `<name>_details.rate`, else counter deltas. */
export class RateTracker {
  constructor(names) {
    this.names = names;
    this.last = null;
  }

  /** Per-second rates of `stats` (a message_stats object) observed at `t` ms. */
  rates(stats, t) {
    const out = {};
    const counters = {};
    for (const name of this.names) {
      const counter = stats ? stats[name] : undefined;
      if (typeof counter === 'number') counters[name] = counter;
      const given = stats ? get(stats, `${name}_details.rate`) : undefined;
      if (typeof given === 'number') out[name] = given;
      else if (this.last && typeof counter === 'number' && typeof this.last.counters[name] === 'number'
               && t > this.last.t) {
        out[name] = Math.max(0, (counter - this.last.counters[name]) / ((t - this.last.t) / 1000));
      } else if (stats) out[name] = 0;
    }
    this.last = {t, counters};
    return out;
  }
}

/**
 * Points from RabbitMQ samples. gauges: {key: [{sample, timestamp}]} (values as they are);
 * counters: {key: [{sample, timestamp}]} (cumulative: turned into per-second rates).
 * Returns [{t, values}] oldest first.
 */
export function pointsFromSamples(gauges = {}, counters = {}) {
  const byTime = new Map();
  const at = (t) => {
    if (!byTime.has(t)) byTime.set(t, {t, values: {}});
    return byTime.get(t).values;
  };
  for (const [key, samples] of Object.entries(gauges)) {
    if (!Array.isArray(samples)) continue;
    for (const s of samples) at(s.timestamp)[key] = s.sample;
  }
  for (const [key, samples] of Object.entries(counters)) {
    if (!Array.isArray(samples)) continue;
    const sorted = [...samples].sort((a, b) => a.timestamp - b.timestamp);
    for (let i = 1; i < sorted.length; i += 1) {
      const dt = (sorted[i].timestamp - sorted[i - 1].timestamp) / 1000;
      if (dt > 0) at(sorted[i].timestamp)[key] = Math.max(0, (sorted[i].sample - sorted[i - 1].sample) / dt);
    }
  }
  return [...byTime.values()].sort((a, b) => a.t - b.t);
}

export const HISTORY_QUERY = 'lengths_age=600&lengths_incr=5&msg_rates_age=600&msg_rates_incr=5';

export const RATE_SERIES = [
  {key: 'publish', label: 'Publish'},
  {key: 'deliver', label: 'Deliver'},
  {key: 'get', label: 'Get'},
  {key: 'ack', label: 'Acknowledge', dash: [6, 3]},
  {key: 'redeliver', label: 'Redeliver'},
];

export const LENGTH_SERIES = [
  {key: 'messages_ready', label: 'Ready'},
  {key: 'messages_unacknowledged', label: 'Unacked'},
  {key: 'messages', label: 'Total', dash: [6, 3]},
];

/** Seed `lengths` and `rates` histories from an object carrying RabbitMQ's samples, if it has any. */
export function seedHistories(lengths, rates, lengthsObj, statsObj, now = Date.now()) {
  const gauges = {};
  for (const s of LENGTH_SERIES) gauges[s.key] = get(lengthsObj, `${s.key}_details.samples`);
  const counters = {};
  for (const s of RATE_SERIES) counters[s.key] = get(statsObj, `${s.key}_details.samples`);
  const lengthPoints = pointsFromSamples(gauges, {});
  const ratePoints = pointsFromSamples({}, counters);
  // The samples carry the server's clock; the browser's may differ. The newest sample is "now".
  const newest = Math.max(...lengthPoints.concat(ratePoints).map((pt) => pt.t));
  const shift = (points) => points.map((pt) => ({t: pt.t + (now - newest) - 1, values: pt.values}));
  if (lengthPoints.length) lengths.seed(shift(lengthPoints));
  if (ratePoints.length) rates.seed(shift(ratePoints));
}

/**
 * Wrap a DataTable load function so that items lacking `<counter>_details.rate` get one computed from
 * the change of the counter since the previous load (a server that gives per-object counters but no
 * rates). `counters` are dotted paths such as 'message_stats.publish'; `keyOf(item)` identifies an item.
 */
export function withCounterRates(load, keyOf, counters) {
  const previous = new Map();
  return async (state) => {
    const result = await load(state);
    const now = Date.now();
    for (const item of result.items) {
      const key = keyOf(item);
      const seen = {};
      const before = previous.get(key);
      for (const path of counters) {
        const value = get(item, path);
        if (typeof value !== 'number') continue;
        seen[path] = value;
        const dot = path.lastIndexOf('.');
        const parent = dot < 0 ? item : get(item, path.slice(0, dot));
        const detailsKey = path.slice(dot + 1) + '_details';
        if (!parent || (parent[detailsKey] && typeof parent[detailsKey].rate === 'number')) continue;
        if (before && typeof before.values[path] === 'number' && now > before.t) {
          parent[detailsKey] = {rate: Math.max(0, (value - before.values[path]) / ((now - before.t) / 1000))};
        }
      }
      previous.set(key, {t: now, values: seen});
    }
    return result;
  };
}
