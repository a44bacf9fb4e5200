// #/overview: object totals, live charts of queued messages and message rates, the node, listeners,
// and (administrators) definitions export and import, of the whole node or of one virtual host.

import {GET, hasTag, POST} from './api.js';
import {History, LineChart} from './chart.js';
import {badge, facts, field, fill, h, link, section, select, setOptions} from './dom.js';
import {bytes, duration, num} from './fmt.js';
import {actionForm, forgetVhosts, vhostNames} from './forms.js';
import {HISTORY_QUERY, LENGTH_SERIES, RATE_SERIES, RateTracker, seedHistories} from './series.js';

// Kept across navigations: the charts show what was collected while the user looked elsewhere.
const store = {lengths: new History(), rates: new History(), tracker: new RateTracker(RATE_SERIES.map((s) => s.key)),
  seeded: false};

/** A horizontal usage bar with a text label: used of limit. */
export function usageBar(used, limit, text, alarm = false) {
  const fraction = limit > 0 ? Math.min(1, used / limit) : 0;
  const bar = h('span', {class: ['bar', alarm ? 'alarm' : fraction > 0.8 ? 'high' : null]}, h('span', {class: 'fill'}));
  bar.firstChild.style.width = `${(fraction * 100).toFixed(1)}%`;
  return h('span', {class: 'usage', title: `${Math.round(fraction * 100)}% used`}, bar, h('span', {}, text));
}

const ALL = '';

function scopeSelect() {
  const el = select([[ALL, 'All virtual hosts']]);
  vhostNames().then((names) => setOptions(el, [[ALL, 'All virtual hosts'], ...names.map((n) => [n, n])], ALL))
    .catch(() => {});
  return el;
}

const definitionsPath = (vhost) => (vhost === ALL ? '/api/definitions' : `/api/definitions/${encodeURIComponent(vhost)}`);

/** Download the definitions (GET /api/definitions[/{vhost}]) and upload a file of them (POST). */
function definitionsPanel(onImported) {
  const exportScope = scopeSelect();
  const exported = actionForm({
    label: 'Export definitions', submit: 'Download',
    fields: [field('Virtual host', exportScope, 'Users, virtual hosts, permissions, policies, limits, queues, ' +
      'exchanges and bindings (one virtual host: its policies, queues, exchanges and bindings).')],
    async action() {
      const defs = await GET(definitionsPath(exportScope.value));
      const day = new Date().toISOString().slice(0, 10);
      const what = exportScope.value === ALL ? 'all' : encodeURIComponent(exportScope.value);  // '/' is %2F
      const file = `hutch-definitions-${location.hostname}-${what}-${day}.json`;
      const url = URL.createObjectURL(new Blob([JSON.stringify(defs, null, 2) + '\n'], {type: 'application/json'}));
      const a = h('a', {href: url, download: file, hidden: true});
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
      return `Saved ${file}.`;
    },
  });
  const importScope = scopeSelect();
  const upload = h('input', {type: 'file', accept: '.json,application/json'});
  const imported = actionForm({
    label: 'Import definitions', submit: 'Upload',
    fields: [h('div', {class: 'row'}, field('Definitions file', upload), field('Into', importScope,
      'All: the file as it is. One virtual host: its queues, exchanges, bindings and policies go there.'))],
    async action() {
      const file = upload.files[0];
      if (!file) throw new Error('Pick a definitions file (JSON, as exported here or by RabbitMQ).');
      let doc;
      try {
        doc = JSON.parse(await file.text());
      } catch (exc) {
        throw new Error(`${file.name} is not valid JSON: ${exc.message}`);
      }
      await POST(definitionsPath(importScope.value), doc);
      forgetVhosts();
      upload.value = '';
      onImported();
      return `Imported ${file.name}` + (importScope.value === ALL ? '.' : ` into virtual host '${importScope.value}'.`);
    },
  });
  return section('Definitions', h('div', {class: 'columns tight'},
    h('div', {}, h('h3', {}, 'Export'), exported), h('div', {}, h('h3', {}, 'Import'), imported)));
}

export function overviewPage() {
  const totals = h('div', {class: 'totals'});
  const lengthsChart = new LineChart({title: 'Queued messages', series: LENGTH_SERIES, history: store.lengths});
  const ratesChart = new LineChart({title: 'Message rates', series: RATE_SERIES, kind: 'rate', history: store.rates});
  const alarms = h('div', {class: 'alarms'});
  const nodeBox = h('div');
  const listeners = h('div');
  const el = h('div', {class: 'overview'},
    alarms,
    totals,
    h('div', {class: 'charts'}, lengthsChart.el, ratesChart.el),
    h('div', {class: 'columns'}, section('Node', nodeBox), section('Listeners', listeners)),
    hasTag('administrator') ? definitionsPanel(() => { refresh().catch(() => {}); }) : null);

  async function refresh() {
    const path = store.seeded ? '/api/overview' : '/api/overview?' + HISTORY_QUERY;
    const [o, nodes] = await Promise.all([GET(path),
      hasTag('administrator', 'monitoring') ? GET('/api/nodes').catch(() => null) : null]);
    const now = Date.now();
    if (!store.seeded) {
      seedHistories(store.lengths, store.rates, o.queue_totals, o.message_stats, now);
      store.seeded = true;
    }
    store.lengths.push(now, {...o.queue_totals});
    store.rates.push(now, store.tracker.rates(o.message_stats, now));
    lengthsChart.draw();
    ratesChart.draw();

    const t = o.object_totals || {};
    fill(totals, [
      ['Connections', t.connections, '#/connections'], ['Channels', t.channels, '#/channels'],
      ['Exchanges', t.exchanges, '#/exchanges'], ['Queues', t.queues, '#/queues'],
      ['Consumers', t.consumers, '#/queues'],
      ['Messages', o.queue_totals && o.queue_totals.messages, '#/queues'],
    ].map(([label, value, href]) => h('a', {class: 'total', href}, h('span', {class: 'n'}, num(value)),
      h('span', {class: 'what'}, label))));

    const node = nodes && nodes[0];
    const raised = [];
    if (node && node.mem_alarm) raised.push('Memory alarm: publishers are blocked until memory use falls.');
    if (node && node.disk_free_alarm) raised.push('Disk alarm: publishers are blocked until disk space is freed.');
    fill(alarms, raised.map((text) => h('p', {class: 'notice error', role: 'alert'}, text)));
    fill(nodeBox, facts([
      ['Node', node ? link('#/nodes', node.name) : o.node],
      ['Cluster', o.cluster_name],
      ['Version', `${o.product_name} ${o.product_version}`],
      ['Uptime', node ? duration(node.uptime) : undefined],
      ['Memory', node ? `${bytes(node.mem_used)} of ${bytes(node.mem_limit)} high watermark` : undefined],
      ['Disk free', node ? `${bytes(node.disk_free)} (limit ${bytes(node.disk_free_limit)})` : undefined],
      ['Alarms', node ? (raised.length ? badge('raised', 'bad') : badge('none', 'ok')) : undefined],
    ]));
    fill(listeners, h('table', {class: 'data compact', 'aria-label': 'Listeners'},
      h('thead', {}, h('tr', {}, ['Protocol', 'Address', 'Port'].map((c) => h('th', {scope: 'col'}, c)))),
      h('tbody', {}, (o.listeners || []).map((l) => h('tr', {},
        h('th', {scope: 'row'}, l.protocol), h('td', {}, l.ip_address), h('td', {class: 'num'}, String(l.port)))))));
  }

  return {
    title: 'Overview', nav: 'overview', el, refresh,
    destroy() { lengthsChart.destroy(); ratesChart.destroy(); },
  };
}
