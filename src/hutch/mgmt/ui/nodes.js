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
  return [h('span', {class: low ? 'bad-text' : null}, bytes(n.disk_free)),
    h('div', {class: 'muted small'}, `limit ${bytes(n.disk_free_limit)}`)];
}

export function nodesPage() {
  const body = h('tbody');
  const columns = [['Name'], ['Uptime'], ['Memory', 'resident memory of the node process, of its high watermark'],
    ['Disk free', 'free space where the node keeps its data, and the limit below which publishers are blocked'],
    ['File descriptors', 'open files and sockets, of the process limit'], ['Sockets', 'client connections'],
    ['Threads', 'operating-system threads of the node process, of the limit (proc_used / proc_total)'],
    ['Cores'], ['Alarms', 'resource alarms: while one is raised, publishing connections are blocked']];
  const el = h('div', {class: 'panel'}, h('div', {class: 'table-scroll'}, h('table', {class: 'data nodes', 'aria-label': 'Nodes'},
    h('thead', {}, h('tr', {}, columns.map(([c, help]) => h('th', {scope: 'col', title: help}, c)))), body)),
  h('p', {class: 'hint'}, 'Memory is the resident memory of the node\'s process; when it passes the high watermark, ' +
    'or free disk space falls below its limit, an alarm blocks publishers until it clears. ' +
    'Hover a column heading for what it counts.'));

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
