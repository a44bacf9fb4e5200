// A small line chart on <canvas>, for rolling time series (queued messages, message rates).
// The series history lives in a History object the page keeps, so a chart can be rebuilt (after a
// navigation) without losing what was collected. The legend below the canvas shows each series'
// latest value as text, so the figures are readable without the plot.

import {fill, h} from './dom.js';
import {byteRate, clock, num, rate} from './fmt.js';

export const PALETTE = ['#2563eb', '#16a34a', '#d97706', '#9333ea', '#dc2626', '#0891b2'];

/** Timestamped samples {t: ms, values: {key: number}} over a rolling window. */
export class History {
  constructor(windowMs = 10 * 60 * 1000, maxPoints = 720) {
    this.windowMs = windowMs;
    this.maxPoints = maxPoints;
    this.points = [];
  }

  push(t, values) {
    const last = this.points[this.points.length - 1];
    if (last && t <= last.t) return;
    this.points.push({t, values});
    const oldest = t - this.windowMs;
    while (this.points.length > this.maxPoints || (this.points.length > 2 && this.points[0].t < oldest)) {
      this.points.shift();
    }
  }

  /** Replace the history with server-side samples (older first), keeping later local points. */
  seed(points) {
    const first = this.points.length ? this.points[0].t : Infinity;
    this.points = points.filter((pt) => pt.t < first).concat(this.points);
  }

  latest() {
    return this.points.length ? this.points[this.points.length - 1].values : {};
  }
}

/**
 * The y axis for values up to `max`: {top, step} with a round step (1, 2 or 5 times a power of ten),
 * at most four steps, and whole steps when the values are whole counts (no 0.25 ticks of messages).
 */
export function axisScale(max, whole) {
  if (!(max > 0)) return {top: 1, step: whole ? 1 : 0.25};
  const raw = max / 4;
  const exp = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = [1, 2, 5, 10].map((m) => m * exp).find((s) => s >= raw);
  if (whole) step = Math.max(1, Math.round(step));
  return {top: Math.ceil(max / step - 1e-9) * step, step};
}

export function axisLabel(value) {
  if (value >= 1e6) return (value / 1e6).toFixed(value % 1e6 ? 1 : 0) + 'M';
  if (value >= 1e3) return (value / 1e3).toFixed(value % 1e3 ? 1 : 0) + 'k';
  return String(Number(value.toFixed(2)));
}

function bytesLabel(value) {
  return value >= 1024 * 1024 ? `${Number((value / 1024 / 1024).toFixed(1))}M`
    : value >= 1024 ? `${Number((value / 1024).toFixed(1))}K` : String(Number(value.toFixed(2)));
}

export class LineChart {
  /**
   * series: [{key, label, color?, dash?}]; kind: 'rate' (per second), 'bytes' (bytes per second) or
   * 'count' (whole numbers).
   * The element carries data-points (samples drawn) and data-latest (JSON), for tests and tools.
   */
  constructor({title, series, kind = 'count', history, height = 180}) {
    this.title = title;
    this.series = series.map((s, i) => ({color: PALETTE[i % PALETTE.length], ...s}));
    this.kind = kind;
    this.history = history;
    this.height = height;
    this.canvas = h('canvas', {role: 'img', height});
    this.legend = h('ul', {class: 'legend'});
    this.el = h('figure', {class: 'chart'}, h('figcaption', {}, title), this.canvas, this.legend);
    this.resizer = new ResizeObserver(() => this.draw());
    this.resizer.observe(this.canvas);
  }

  destroy() {
    this.resizer.disconnect();
  }

  format(v) {
    if (this.kind === 'bytes') return byteRate(v);
    return this.kind === 'rate' ? rate(v) : num(v);
  }

  draw() {
    const points = this.history.points;
    const latest = this.history.latest();
    this.el.dataset.points = String(points.length);
    this.el.dataset.latest = JSON.stringify(latest);
    fill(this.legend, this.series.map((s) => h('li', {},
      h('span', {class: ['swatch', s.dash ? 'dashed' : null], 'aria-hidden': 'true', dataset: {color: s.color}}),
      h('span', {class: 'label'}, s.label),
      h('span', {class: 'value'}, this.format(latest[s.key])))));
    for (const sw of this.legend.querySelectorAll('.swatch')) sw.style.color = sw.dataset.color;
    this.canvas.setAttribute('aria-label', `${this.title}: ` + this.series
      .map((s) => `${s.label} ${this.format(latest[s.key])}`).join(', '));
    this.paint(points);
  }

  paint(points) {
    const canvas = this.canvas;
    const width = canvas.clientWidth;
    const height = this.height;
    if (!width) return;
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    canvas.style.height = height + 'px';
    const g = canvas.getContext('2d');
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, width, height);
    const styles = getComputedStyle(canvas);
    const ink = styles.getPropertyValue('--chart-ink').trim() || '#374151';
    const grid = styles.getPropertyValue('--chart-grid').trim() || '#e5e7eb';
    g.font = '12px system-ui, sans-serif';
    const left = 48;
    const right = 8;
    const top = 8;
    const bottom = 22;
    const plotW = width - left - right;
    const plotH = height - top - bottom;
    if (points.length < 2) {
      g.fillStyle = ink;
      g.textAlign = 'center';
      g.fillText(points.length ? 'Collecting data…' : 'Waiting for data…', width / 2, height / 2);
      return;
    }
    const t1 = points[points.length - 1].t;
    const t0 = Math.min(points[0].t, t1 - 60 * 1000);
    let max = 0;
    for (const pt of points) {
      for (const s of this.series) {
        const v = pt.values[s.key];
        if (typeof v === 'number' && v > max) max = v;
      }
    }
    const {top: axisTop, step} = axisScale(max, this.kind === 'count');
    max = axisTop;
    const x = (t) => left + ((t - t0) / (t1 - t0)) * plotW;
    const y = (v) => top + plotH - (v / max) * plotH;
    // grid and y labels
    g.strokeStyle = grid;
    g.lineWidth = 1;
    g.fillStyle = ink;
    g.textAlign = 'right';
    g.textBaseline = 'middle';
    const ticks = Math.round(max / step);
    for (let i = 0; i <= ticks; i += 1) {
      const v = step * i;
      const yy = Math.round(y(v)) + 0.5;
      g.beginPath();
      g.moveTo(left, yy);
      g.lineTo(left + plotW, yy);
      g.stroke();
      g.fillText(this.kind === 'bytes' ? bytesLabel(v) : axisLabel(v), left - 6, yy);
    }
    // x labels: the ends and the middle
    g.textBaseline = 'top';
    for (const [t, align] of [[t0, 'left'], [(t0 + t1) / 2, 'center'], [t1, 'right']]) {
      g.textAlign = align;
      g.fillText(clock(t), x(t), top + plotH + 6);
    }
    // lines; a gap of more than 3 median steps (the tab was hidden, the server was down) breaks the line
    const steps = points.slice(1).map((pt, i) => pt.t - points[i].t).sort((a, b) => a - b);
    const gap = 3 * (steps[Math.floor(steps.length / 2)] || 5000);
    g.lineWidth = 2;
    g.lineJoin = 'round';
    for (const s of this.series) {
      g.strokeStyle = s.color;
      g.setLineDash(s.dash || []);  // dashed series stay visible where they overlap a solid one
      g.beginPath();
      let drawing = false;
      let prevT = null;
      for (const pt of points) {
        const v = pt.values[s.key];
        if (typeof v !== 'number' || (prevT !== null && pt.t - prevT > gap)) drawing = false;
        prevT = pt.t;
        if (typeof v !== 'number') continue;
        if (drawing) g.lineTo(x(pt.t), y(v));
        else g.moveTo(x(pt.t), y(v));
        drawing = true;
      }
      g.stroke();
    }
  }
}
