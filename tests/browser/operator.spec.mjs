// Browser test of the web UI's operator pages (issue 22): headless Debian chromium driven by playwright-core.
//
//   NODE_PID=1234 node operator.spec.mjs NODE_A_URL NODE_B_URL ARTIFACTS_DIR
//
// Run by tests/browser/test_ui_operator.py, which prepares node A (a DLX/TTL queue, a vhost and a user to
// limit, a limit set through the API, a client in confirm mode) and node B (fresh), and checks over AMQP
// and the API afterwards what this script did through the pages. Each step prints "ok - <step>"; a failure
// prints "FAILED - <step>: <error>", saves failure.png and exits 1. Node A is stopped with SIGSTOP (NODE_PID)
// to see the stale-node warning, and resumed with SIGCONT. Screenshots at 1440 and 390 px go to
// ARTIFACTS_DIR (docs/web-ui.md shows some of them); definitions.json is the file the export saved.

import {mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {chromium} from 'playwright-core';
import {allPassed, CHROMIUM_ARGS, expectText, formOutcome as outcome, stepper, succeeded} from './steps.mjs';

const [nodeA, nodeB, artifacts] = process.argv.slice(2);
const pid = Number(process.env.NODE_PID);
if (!nodeA || !nodeB || !artifacts || !pid) {
  console.error('usage: NODE_PID=PID node operator.spec.mjs NODE_A_URL NODE_B_URL ARTIFACTS_DIR');
  process.exit(2);
}
const WIDE = {width: 1440, height: 900};
const NARROW = {width: 390, height: 844};

const profile = mkdtempSync(join(tmpdir(), 'hutch-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: CHROMIUM_ARGS, headless: true, viewport: WIDE,
  acceptDownloads: true, deviceScaleFactor: 1,
});
context.setDefaultTimeout(10000);
const page = context.pages()[0] || await context.newPage();
const pageErrors = [];
const watch = (pg) => {
  pg.on('pageerror', (e) => pageErrors.push(e.message));
  pg.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) pageErrors.push(m.text());
  });
};
watch(page);

const run = stepper();
const step = run.step;
let stopped = false;
async function shot(pg, name, fullPage = false) {
  await pg.evaluate(() => {
    window.scrollTo(0, 0);
    document.getElementById('toasts').replaceChildren();  // a toast of an earlier step would hide the page
  });
  await pg.screenshot({path: join(artifacts, name), fullPage});
}
async function loaded(pg, hash, title) {
  await pg.goto(pg.url().split('#')[0] + hash);
  await pg.getByRole('heading', {name: title, level: 1}).waitFor();
  await pg.waitForFunction(() => document.getElementById('page-status').textContent.startsWith('Updated'));
  const problem = pg.locator('#page-problem');
  if (await problem.isVisible()) throw new Error(`${hash}: ${await problem.textContent()}`);
}
async function logIn(pg, base) {
  await pg.goto(base + '/');
  await pg.getByLabel('Username').fill('guest');
  await pg.getByLabel('Password').fill('guest');
  await pg.getByRole('button', {name: 'Log in'}).click();
  await pg.getByRole('heading', {name: 'Overview', level: 1}).waitFor();
}
/** Facts (dt/dd) of the section headed `heading`, as {term: text}. */
async function factsOf(pg, heading) {
  const sec = pg.locator('section.panel', {has: pg.getByRole('heading', {name: heading, level: 2, exact: true})});
  return sec.locator('dl.facts').first().evaluate((dl) => Object.fromEntries(
    [...dl.querySelectorAll('dt')].map((dt) => [dt.textContent, dt.nextElementSibling.textContent])));
}

try {
  await step('log in to node A', async () => {
    await logIn(page, nodeA);
    await page.locator('#refresh-every').selectOption('2000');
  });

  await step('queue list: feature badges and the idle state', async () => {
    await loaded(page, '#/queues', 'Queues');
    const row = page.locator('table.data tbody tr', {hasText: 'ui-dlx'});
    for (const b of ['D', 'TTL', 'Lim', 'Ovfl', 'DLX', 'DLK']) {
      await row.locator('.features .badge', {hasText: new RegExp(`^${b}$`)}).waitFor();
    }
    if (await row.locator('.badge', {hasText: /^Args$/}).count()) throw new Error('known arguments shown as Args');
    const ttl = await row.locator('.badge', {hasText: /^TTL$/}).getAttribute('title');
    if (!ttl.includes('x-message-ttl = 60000')) throw new Error(`TTL badge title: ${ttl}`);
    await expectText(row.locator('.badge'), 'idle');
    await shot(page, 'queues-1440.png');
  });

  await step('queue page: the arguments as text', async () => {
    await page.getByRole('link', {name: 'ui-dlx', exact: true}).click();
    await page.getByRole('heading', {name: 'Queue ui-dlx', level: 1}).waitFor();
    await page.waitForFunction(() => document.getElementById('page-status').textContent.startsWith('Updated'));
    const got = await factsOf(page, 'Arguments and policy settings');
    const want = {
      'Type': 'classic',
      'Message TTL': '60 s (60,000 ms), from argument x-message-ttl',
      'Max length': '100 messages, from argument x-max-length',
      'Overflow': 'reject-publish, from argument x-overflow',
      'Dead-letter exchange': 'ui-dead, from argument x-dead-letter-exchange',
      'Dead-letter routing key': '"expired", from argument x-dead-letter-routing-key',
    };
    for (const [k, v] of Object.entries(want)) {
      if (got[k] !== v) throw new Error(`${k}: got ${JSON.stringify(got[k])}, expected ${JSON.stringify(v)}`);
    }
    const details = await factsOf(page, 'Details');
    if (details.State !== 'idle') throw new Error(`state ${details.State}`);
    await shot(page, 'queue-1440.png');
  });

  await step('limits set through the API and with hutchctl show on the Limits tab', async () => {
    await loaded(page, '#/limits', 'Limits');
    await page.locator('table.data tbody tr', {hasText: 'ui-limited'}).filter({hasText: 'max-channels'})
      .filter({hasText: '7'}).waitFor();
    // and one set with hutchctl (set_vhost_limits)
    await page.locator('table.data tbody tr', {hasText: 'ui-capped'}).filter({hasText: 'max-connections'})
      .filter({hasText: '50'}).waitFor();
  });

  await step('set a vhost limit and a user limit in the UI', async () => {
    const setLimit = async (label, ownerLabel, owner, limit, value) => {
      const form = page.getByRole('form', {name: label});
      await form.getByLabel(ownerLabel).selectOption(owner);
      await form.getByLabel('Limit').selectOption(limit);
      await form.getByLabel('Value').fill(value);
      await form.getByRole('button', {name: 'Set limit'}).click();
      return form;
    };
    await setLimit('Set a virtual host limit', 'Virtual host', 'ui-capped', 'max-queues', '1');
    await succeeded(page, 'Set a virtual host limit');
    const uform = await setLimit('Set a user limit', 'User', 'ui-limited', 'max-connections', '1');
    await succeeded(page, 'Set a user limit');
    await page.locator('table.data tbody tr', {hasText: 'ui-capped'}).filter({hasText: 'max-queues'}).waitFor();
    await page.locator('table.data tbody tr', {hasText: 'ui-limited'}).filter({hasText: 'max-connections'}).waitFor();
    // a value that is not a whole number is refused before it is sent
    await uform.getByLabel('Value').fill('1.5');
    await uform.getByRole('button', {name: 'Set limit'}).click();
    const bad = await outcome(page, 'Set a user limit');
    if (bad.ok || !bad.text.includes('whole number')) throw new Error(`1.5 accepted: ${bad.text}`);
    await shot(page, 'limits-1440.png', true);
  });

  await step('clear a limit in the UI', async () => {
    const row = page.locator('table.data tbody tr', {hasText: 'ui-limited'}).filter({hasText: 'max-channels'});
    await row.getByRole('button', {name: 'Clear'}).click();
    await expectText(page.getByRole('dialog'), 'Clear the max-channels limit of user');
    await page.getByRole('dialog').getByRole('button', {name: 'Clear'}).click();
    await row.waitFor({state: 'detached'});
  });

  await step('user page: tags, permissions, topic permissions, limits', async () => {
    await loaded(page, '#/users', 'Users');
    await page.getByRole('link', {name: 'ui-limited', exact: true}).click();
    await page.getByRole('heading', {name: 'User ui-limited', level: 1}).waitFor();
    const sec = (name) => page.locator('section.panel', {has: page.getByRole('heading', {name, level: 2, exact: true})});
    await expectText(sec('Permissions').locator('tbody tr'), '/');
    await expectText(sec('Topic permissions').locator('tbody tr'), 'amq.topic');
    await expectText(sec('Limits').locator('tbody tr'), 'max-connections');
    await expectText(sec('Details'), 'none (AMQP only)');
    await shot(page, 'user-1440.png', true);
  });

  await step('vhost page: queues, permissions, limits; no default queue type where none was set', async () => {
    await loaded(page, '#/vhosts', 'Virtual hosts');
    await page.getByRole('link', {name: 'ui-capped', exact: true}).click();
    await page.getByRole('heading', {name: 'Virtual host ui-capped', level: 1}).waitFor();
    await page.waitForFunction(() => document.getElementById('page-status').textContent.startsWith('Updated'));
    const details = await factsOf(page, 'Details');
    if ('Default queue type' in details) throw new Error(`default queue type shown: ${details['Default queue type']}`);
    if (details.Description !== 'a vhost the UI limits') throw new Error(`description ${details.Description}`);
    await expectText(page.locator('section.panel', {hasText: 'Limits'}).locator('tbody tr'), 'max-queues');
    await shot(page, 'vhost-1440.png', true);
  });

  await step('deleting the user you are logged in as gets a specific warning', async () => {
    await loaded(page, '#/users', 'Users');
    await page.locator('table.data tbody tr', {hasText: 'guest'}).getByRole('button', {name: 'Delete'}).click();
    await expectText(page.getByRole('dialog'), "You are logged in as 'guest'");
    await page.getByRole('dialog').getByRole('button', {name: 'Cancel'}).click();
    await page.locator('table.data tbody tr', {hasText: 'ui-limited'}).getByRole('button', {name: 'Delete'}).click();
    const other = await page.getByRole('dialog').textContent();
    if (other.includes('You are logged in')) throw new Error(`another user's warning: ${other}`);
    await page.getByRole('dialog').getByRole('button', {name: 'Cancel'}).click();
  });

  await step('the key/value form drops nothing silently', async () => {
    await loaded(page, '#/queues', 'Queues');
    await page.getByText('Add a new queue').click();
    const form = page.getByRole('form', {name: 'Add a new queue'});
    await form.getByLabel('Name').fill('ui-kv');
    await form.locator('.kv-row').first().getByLabel('Value').fill('5000');
    await form.getByRole('button', {name: 'Add queue'}).click();
    let result = await outcome(page, 'Add a new queue');
    if (result.ok || !result.text.includes('"5000" has no key')) throw new Error(`a value without a key: ${result.text}`);
    await form.locator('.kv-row').first().getByLabel('Value').fill('');
    await form.getByRole('button', {name: 'x-dead-letter-exchange', exact: true}).click();
    await form.getByRole('button', {name: 'Add queue'}).click();
    result = await outcome(page, 'Add a new queue');
    if (result.ok || !result.text.includes('x-dead-letter-exchange has no value')) {
      throw new Error(`a suggested key without a value: ${result.text}`);
    }
  });

  await step('connection page: client properties, TLS, rates, channels', async () => {
    await loaded(page, '#/connections', 'Connections');
    await page.locator('table.data tbody tr', {hasText: 'ui-held'}).getByRole('link').first().click();
    await page.getByRole('heading', {name: /^Connection /, level: 1}).waitFor();
    await page.waitForFunction(() => document.getElementById('page-status').textContent.startsWith('Updated'));
    const tls = await factsOf(page, 'TLS');
    if (tls.TLS !== 'no: plain TCP') throw new Error(`TLS: ${tls.TLS}`);
    const props = await factsOf(page, 'Client properties');
    if (!props.product.includes('Pika')) throw new Error(`client properties: ${JSON.stringify(props)}`);
    if (!props.capabilities.includes('publisher_confirms')) throw new Error('no capabilities');
    await page.waitForFunction(() => Number(document.querySelector('figure.chart').dataset.points) >= 3, null,
      {timeout: 20000});
    await expectText(page.locator('table.data tbody tr'), 'C');
    await shot(page, 'connection-1440.png', true);
  });

  await step('channel page: consumers, unacked and unconfirmed counts', async () => {
    await page.locator('table.data tbody tr').first().getByRole('link').first().click();
    await page.getByRole('heading', {name: /^Channel /, level: 1}).waitFor();
    await page.waitForFunction(() => document.getElementById('page-status').textContent.startsWith('Updated'));
    const details = await factsOf(page, 'Details');
    if (details.Unconfirmed !== '0' || details.Unacknowledged !== '0') throw new Error(JSON.stringify(details));
    if (!details.Prefetch.includes('10 per consumer')) throw new Error(`prefetch ${details.Prefetch}`);
    await expectText(page.locator('table.data tbody tr'), 'ui-dead-letters');
    await page.waitForFunction(() => Number(document.querySelector('figure.chart').dataset.points) >= 3, null,
      {timeout: 20000});
    await shot(page, 'channel-1440.png', true);
  });

  await step('export the definitions of node A', async () => {
    await loaded(page, '#/overview', 'Overview');
    const form = page.getByRole('form', {name: 'Export definitions'});
    const [download] = await Promise.all([page.waitForEvent('download'),
      form.getByRole('button', {name: 'Download'}).click()]);
    await download.saveAs(join(artifacts, 'definitions.json'));
    const text = await succeeded(page, 'Export definitions');
    console.log(`   ${text}`);
    // one virtual host: RabbitMQ's per-vhost document (its queues, no users)
    await form.getByLabel('Virtual host').selectOption('/');
    const [one] = await Promise.all([page.waitForEvent('download'), form.getByRole('button', {name: 'Download'}).click()]);
    if (!one.suggestedFilename().includes('-%2F-')) throw new Error(`file name ${one.suggestedFilename()}`);
    const doc = JSON.parse(readFileSync(await one.path(), 'utf8'));
    if ('users' in doc || !doc.queues.some((q) => q.name === 'ui-dlx')) {
      throw new Error(`the export of / has ${Object.keys(doc).join(', ')}`);
    }
  });

  const fresh = await context.newPage();
  watch(fresh);
  await step('import them into node B; an import error is shown as the API words it', async () => {
    await logIn(fresh, nodeB);
    const form = fresh.getByRole('form', {name: 'Import definitions'});
    const broken = join(artifacts, 'broken-definitions.json');
    writeFileSync(broken, JSON.stringify({queues: [{name: 'q', vhost: 'no-such-vhost', durable: true,
      auto_delete: false, arguments: {}}]}));
    await form.getByLabel('Definitions file').setInputFiles(broken);
    await form.getByRole('button', {name: 'Upload'}).click();
    const bad = await outcome(fresh, 'Import definitions');
    const reason = "400 bad_request: queues[0]: virtual host 'no-such-vhost' does not exist and the definitions do not create it";
    if (bad.ok || !bad.text.includes(reason)) throw new Error(`import error: ${bad.text}`);
    await form.getByLabel('Definitions file').setInputFiles(join(artifacts, 'definitions.json'));
    await form.getByRole('button', {name: 'Upload'}).click();
    console.log(`   ${await succeeded(fresh, 'Import definitions')}`);
    // the page refreshes after an import: node B's totals now count node A's queues
    await fresh.waitForFunction(() => [...document.querySelectorAll('.total')].some((t) =>
      t.querySelector('.what').textContent === 'Queues' && t.querySelector('.n').textContent !== '0'), null, {timeout: 20000});
    await shot(fresh, 'overview-definitions-1440.png', true);
  });
  await fresh.close();

  await step('a stopped node: stale warning, greyed figures; cleared when it answers again', async () => {
    await loaded(page, '#/overview', 'Overview');
    await page.waitForFunction(() => Number(document.querySelector('figure.chart').dataset.points) >= 6, null,
      {timeout: 30000});
    process.kill(pid, 'SIGSTOP');
    stopped = true;
    const stoppedAt = Date.now();
    const since = new Date().toLocaleTimeString('en-GB', {hour12: false, hour: '2-digit', minute: '2-digit'});
    const banner = page.locator('#node-stale');
    await banner.waitFor({state: 'visible', timeout: 30000});
    const text = await banner.textContent();
    if (!text.includes('The node has not answered since') || !text.includes('figures below are stale')) {
      throw new Error(`banner: ${text}`);
    }
    console.log(`   ${text} (stopped at ${since}; the warning came ${((Date.now() - stoppedAt) / 1000).toFixed(1)} s later)`);
    const look = await page.evaluate(() => ({stale: document.querySelector('main').classList.contains('stale'),
      opacity: getComputedStyle(document.querySelector('.page-body')).opacity}));
    if (!look.stale || Number(look.opacity) >= 1) throw new Error(`figures not greyed: ${JSON.stringify(look)}`);
    await shot(page, 'overview-stale-1440.png');
    // a page opened while the node is stopped says so too, instead of "Loading…" for good
    await page.goto(page.url().split('#')[0] + '#/queues');
    await page.getByRole('heading', {name: 'Queues', level: 1}).waitFor();
    await banner.waitFor({state: 'visible'});
    await page.waitForFunction(() => document.getElementById('page-status').textContent.startsWith('Last answer'));
    process.kill(pid, 'SIGCONT');
    stopped = false;
    const resumedAt = Date.now();
    await banner.waitFor({state: 'hidden', timeout: 30000});
    console.log(`   cleared ${((Date.now() - resumedAt) / 1000).toFixed(1)} s after SIGCONT (refresh every 2 s)`);
    await page.waitForFunction(() => !document.querySelector('main').classList.contains('stale'));
    await page.waitForFunction(() => document.getElementById('page-status').textContent.startsWith('Updated'));
  });

  await step('390 px wide: the menu folds, no page is wider than the screen', async () => {
    await page.setViewportSize(NARROW);
    const toggle = page.getByRole('button', {name: 'Menu'});
    const pages = [['#/overview', 'Overview', 'overview-390.png'], ['#/queues', 'Queues', 'queues-390.png'],
      ['#/queues/%2F/ui-dlx', 'Queue ui-dlx', 'queue-390.png'], ['#/limits', 'Limits', 'limits-390.png'],
      ['#/users/ui-limited', 'User ui-limited', 'user-390.png'], ['#/vhosts/ui-capped', 'Virtual host ui-capped', 'vhost-390.png'],
      ['#/connections', 'Connections', 'connections-390.png'], ['#/users', 'Users', 'users-390.png'],
      ['#/channels', 'Channels', 'channels-390.png'], ['#/exchanges', 'Exchanges', 'exchanges-390.png'],
      ['#/exchanges/%2F/amq.topic', 'Exchange amq.topic', 'exchange-390.png'], ['#/vhosts', 'Virtual hosts', 'vhosts-390.png'],
      ['#/permissions', 'Permissions', 'permissions-390.png'], ['#/policies', 'Policies', 'policies-390.png'],
      ['#/nodes', 'Nodes', 'nodes-390.png']];
    for (const [hash, title, file] of pages) {
      await loaded(page, hash, title);
      if (await page.getByRole('navigation', {name: 'Main'}).isVisible()) throw new Error(`${hash}: the menu is not folded`);
      const width = await page.evaluate(() => document.documentElement.scrollWidth);
      if (width > NARROW.width) throw new Error(`${hash}: the page is ${width} px wide`);
      await shot(page, file);
    }
    await toggle.click();
    await page.getByRole('navigation', {name: 'Main'}).getByRole('link', {name: 'Queues'}).click();
    await page.getByRole('heading', {name: 'Queues', level: 1}).waitFor();
    if (await page.getByRole('navigation', {name: 'Main'}).isVisible()) throw new Error('the menu stayed open');
    await toggle.click();
    await shot(page, 'menu-390.png');
    await page.setViewportSize(WIDE);
  });

  await step('a queue setting: the x-argument beats the policy, the operator policy caps numbers', async () => {
    const got = await page.evaluate(async () => {
      const {settingLines} = await import('/ui/queues.js');
      const q = {type: 'classic', policy: 'p', operator_policy: 'op',
        arguments: {'x-message-ttl': 60000, 'x-dead-letter-exchange': 'arg-dlx'}};
      return Object.fromEntries(settingLines(q, {'message-ttl': 1000, 'dead-letter-exchange': 'pol-dlx', 'max-length': 10},
        {'message-ttl': 30000, 'max-length': 50, 'overflow': 'reject-publish'}));
    });
    const want = {
      'Type': 'classic',
      'Message TTL': '30 s (30,000 ms), from operator policy op',
      'Max length': '10 messages, from policy p',
      'Overflow': 'reject-publish, from operator policy op',
      'Dead-letter exchange': 'arg-dlx, from argument x-dead-letter-exchange',
      'Dead-letter routing key': "the message's own routing key",
    };
    if (JSON.stringify(got) !== JSON.stringify(want)) throw new Error(`got ${JSON.stringify(got)}`);
  });

  await step('formats: rates below 1/s, round chart ticks, whole ticks for counts', async () => {
    const got = await page.evaluate(async () => {
      const fmt = await import('/ui/fmt.js');
      const chart = await import('/ui/chart.js');
      const scale = (max, whole) => {
        const {top, step} = chart.axisScale(max, whole);
        return Array.from({length: Math.round(top / step) + 1}, (_, i) => chart.axisLabel(step * i)).join(' ');
      };
      return {
        rates: [fmt.rate(0.04), fmt.rate(0.5), fmt.rate(0.004), fmt.rate(3.25), fmt.rate(0)],
        ticks: [scale(2500, true), scale(1900, true), scale(3, true), scale(0, true), scale(0.3, false)],
      };
    });
    const want = {
      rates: ['0.04/s', '0.50/s', '<0.01/s', '3.3/s', '0/s'],
      ticks: ['0 1k 2k 3k', '0 500 1k 1.5k 2k', '0 1 2 3', '0 1', '0 0.1 0.2 0.3'],
    };
    if (JSON.stringify(got) !== JSON.stringify(want)) throw new Error(`got ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`);
  });

  allPassed(run, pageErrors);
} catch (exc) {
  console.log(`FAILED - ${run.current}: ${exc.message}`);
  if (stopped) process.kill(pid, 'SIGCONT');
  await page.screenshot({path: join(artifacts, 'failure.png'), fullPage: true}).catch(() => {});
  process.exitCode = 1;
} finally {
  await context.close();
  rmSync(profile, {recursive: true, force: true});
}
