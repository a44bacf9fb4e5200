// #/nodes: each node's memory, disk, alarms, file descriptors, sockets, processes and uptime.

import {GET} from './api.js';
import {badge, fill, h} from './dom.js';
import {bytes, duration, num} from './fmt.js';
import {usageBar} from './overview.js';

function alarms(n) {
  const out = [];
  if (n.mem_alarm) out.push(badge('memory', 'bad', 'memory use is above the high watermark: publishers are blocked'));
  if (n.disk_free_alarm) out.push(badge('disk', 'bad', 'free disk space is below the limit: publishers are blocked'));
  return out.length ? out : badge('none', 'ok');
}

function diskCell(n) {
  const low = n.disk_free_alarm;
  return h('span', {class: 'usage'}, h('span', {class: low ? 'bad-text' : null}, bytes(n.disk_free)),
    h('span', {class: 'muted'}, ` limit ${bytes(n.disk_free_limit)}`));
}

export function nodesPage() {
  const body = h('tbody');
  const columns = ['Name', 'Uptime', 'Memory', 'Disk free', 'File descriptors', 'Sockets', 'Processes',
    'Cores', 'Alarms'];
  const el = h('div', {class: 'table-scroll'}, h('table', {class: 'data nodes', 'aria-label': 'Nodes'},
    h('thead', {}, h('tr', {}, columns.map((c) => h('th', {scope: 'col'}, c)))), body));

  async function refresh() {
    const nodes = await GET('/api/nodes');
    fill(body, nodes.map((n) => h('tr', {},
      h('th', {scope: 'row'}, n.name, n.running === false ? [' ', badge('down', 'bad')] : null),
      h('td', {}, n.running === false ? '—' : duration(n.uptime)),
      h('td', {}, usageBar(n.mem_used, n.mem_limit, `${bytes(n.mem_used)} of ${bytes(n.mem_limit)}`, n.mem_alarm)),
      h('td', {}, diskCell(n)),
      h('td', {}, usageBar(n.fd_used, n.fd_total, `${num(n.fd_used)} of ${num(n.fd_total)}`)),
      h('td', {}, usageBar(n.sockets_used, n.sockets_total, `${num(n.sockets_used)} of ${num(n.sockets_total)}`)),
      h('td', {}, usageBar(n.proc_used, n.proc_total, `${num(n.proc_used)} of ${num(n.proc_total)}`)),
      h('td', {class: 'num'}, num(n.processors)),
      h('td', {}, alarms(n)))));
  }

  return {title: 'Nodes', nav: 'nodes', el, refresh};
}
