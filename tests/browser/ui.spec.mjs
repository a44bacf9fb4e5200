// Browser test of hutch's management web UI: headless Debian chromium driven by playwright-core.
//
//   node ui.spec.mjs BASE_URL ARTIFACTS_DIR
//   CA_CERT=ca.pem node ui.spec.mjs https://localhost:PORT ARTIFACTS_DIR
//
// Run by tests/browser/test_ui.py, which starts a hutch-server and a publisher (so the overview charts
// have something to show) and checks the exit status. Each step prints "ok - <step>"; a failure prints
// "FAILED - <step>: <error>", saves failure.png and exits 1. Screenshots of every page go to
// ARTIFACTS_DIR. CHROMIUM overrides the browser (default /usr/bin/chromium).
//
// An https:// BASE_URL needs CA_CERT, the PEM file of the CA that issued the server's certificate.
// Chromium is made to trust it the way a user would on Linux: the CA goes into an NSS database
// ($HOME/.pki/nssdb, made with certutil from Debian's libnss3-tools) in a home directory of its own, and
// the certificate is verified as any other (chain, name, dates). No certificate error is ignored: a first
// step checks that a Chromium without that database refuses the server.

import {execFileSync} from 'node:child_process';
import {mkdirSync, mkdtempSync, rmSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {chromium} from 'playwright-core';
import {CHROMIUM_ARGS, expectText, stepper, succeeded} from './steps.mjs';

const [base, artifacts] = process.argv.slice(2);
if (!base || !artifacts) {
  console.error('usage: [CA_CERT=ca.pem] node ui.spec.mjs BASE_URL ARTIFACTS_DIR');
  process.exit(2);
}
const secure = new URL(base).protocol === 'https:';
if (secure && !process.env.CA_CERT) {
  console.error('an https:// BASE_URL needs CA_CERT (the PEM file of the CA that issued the server certificate)');
  process.exit(2);
}
mkdirSync(artifacts, {recursive: true});

const TIMEOUT_MS = 10000;
const QUEUE = 'ui-test-queue';
const PAYLOAD = 'hello from the browser test';
const STATE_CHANGING = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);

/** A home directory for Chromium whose NSS database trusts `caFile` to issue server certificates. */
function homeTrusting(caFile) {
  const home = mkdtempSync(join(tmpdir(), 'hutch-chromium-home-'));
  const db = join(home, '.pki', 'nssdb');
  mkdirSync(db, {recursive: true});
  execFileSync('certutil', ['-d', `sql:${db}`, '-N', '--empty-password']);
  execFileSync('certutil', ['-d', `sql:${db}`, '-A', '-t', 'C,,', '-n', 'hutch test CA', '-i', caFile]);
  return home;
}

/** Launch Chromium with a fresh profile; `home` (if given) is its $HOME, where it finds its NSS database. */
async function launch(home) {
  const profile = mkdtempSync(join(tmpdir(), 'hutch-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: CHROMIUM_ARGS, headless: true,
    viewport: {width: 1366, height: 768}, env: home ? {...process.env, HOME: home} : process.env,
  });
  return {context, profile};
}

const homes = [];
if (secure) homes.push(homeTrusting(process.env.CA_CERT));
const {context, profile} = await launch(homes[0]);
context.setDefaultTimeout(TIMEOUT_MS);
const page = context.pages()[0] || await context.newPage();
const pageErrors = [];
const failedCalls = [];
page.on('pageerror', (e) => pageErrors.push(e.message));
page.on('console', (m) => {
  if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) pageErrors.push(m.text());
});
const originHeaders = [];  // the Origin header of every state-changing API call (the API's same-origin rule)
page.on('request', (r) => {
  if (STATE_CHANGING.has(r.method()) && r.url().includes('/api/')) originHeaders.push(r.headerValue('origin'));
});
page.on('response', (r) => {
  if (r.status() >= 400 && r.url().includes('/api/')) failedCalls.push(`${r.request().method()} ${r.url()} -> ${r.status()}`);
});

const run = stepper();
const step = run.step;
const shot = (name, fullPage = false) => page.screenshot({path: join(artifacts, name), fullPage});
const outcome = (label) => succeeded(page, label);
const chart = (title) => page.locator('figure.chart', {has: page.locator('figcaption', {hasText: title})});
const chartState = async (title) => {
  const el = chart(title);
  return {
    points: Number(await el.getAttribute('data-points')),
    latest: JSON.parse((await el.getAttribute('data-latest')) || '{}'),
    pixels: await el.locator('canvas').evaluate((c) => c.toDataURL()),
  };
};

try {
  if (secure) {
    await step('a Chromium without the test CA refuses the server', async () => {
      const home = mkdtempSync(join(tmpdir(), 'hutch-chromium-home-'));
      homes.push(home);
      const bare = await launch(home);
      try {
        const error = await bare.context.pages()[0].goto(base + '/').then(() => null, (e) => e.message);
        if (!error || !error.includes('ERR_CERT_AUTHORITY_INVALID')) {
          throw new Error(`expected ERR_CERT_AUTHORITY_INVALID, got ${error || 'the page'}`);
        }
      } finally {
        await bare.context.close();
        rmSync(bare.profile, {recursive: true, force: true});
      }
    });
  }

  await step('login page, wrong password refused', async () => {
    const response = await page.goto(base + '/');
    const tls = await response.securityDetails();
    if (secure) {
      if (!tls || !/^TLS/.test(tls.protocol)) throw new Error(`no TLS on ${base}: ${JSON.stringify(tls)}`);
      console.log(`   ${tls.protocol}, certificate ${tls.subjectName}, trusted through the NSS database`);
    } else if (tls && tls.protocol) {
      throw new Error(`TLS details on a plain http page: ${JSON.stringify(tls)}`);
    }
    await page.getByLabel('Username').fill('guest');
    await page.getByLabel('Password').fill('not-the-password');
    await page.getByRole('button', {name: 'Log in'}).click();
    await expectText(page.getByRole('alert'), 'wrong username or password');
    await shot('01-login.png');
  });

  await step('log in', async () => {
    await page.getByLabel('Password').fill('guest');
    await page.getByRole('button', {name: 'Log in'}).click();
    await page.getByRole('navigation', {name: 'Main'}).waitFor();
    await page.getByRole('heading', {name: 'Overview', level: 1}).waitFor();
    await page.locator('#refresh-every').selectOption('2000');
  });

  await step('overview charts move while a publisher runs', async () => {
    await page.waitForFunction(() => {
      const [lengths, rates] = [...document.querySelectorAll('figure.chart')].map((f) => JSON.parse(f.dataset.latest || '{}'));
      return lengths && rates && lengths.messages > 0 && rates.publish > 0;
    }, null, {timeout: 20000});
    const before = {lengths: await chartState('Queued messages'), rates: await chartState('Message rates')};
    await page.waitForFunction((n) => Number(document.querySelector('figure.chart').dataset.points) >= n + 4,
      before.lengths.points, {timeout: 20000});
    const after = {lengths: await chartState('Queued messages'), rates: await chartState('Message rates')};
    if (after.lengths.latest.messages === before.lengths.latest.messages) throw new Error('queued messages did not change');
    if (after.lengths.pixels === before.lengths.pixels) throw new Error('the queued messages chart was not redrawn');
    if (after.rates.pixels === before.rates.pixels) throw new Error('the message rates chart was not redrawn');
    const publish = await chart('Message rates').locator('.legend li', {hasText: 'Publish'}).locator('.value').textContent();
    if (!/\/s$/.test(publish) || publish === '0/s') throw new Error(`publish rate legend shows ${publish}`);
    console.log(`   queued ${before.lengths.latest.messages} -> ${after.lengths.latest.messages}, publish ${publish}, ` +
      `${after.lengths.points} samples`);
    await shot('02-overview.png');
  });

  await step('create a queue', async () => {
    await page.getByRole('navigation', {name: 'Main'}).getByRole('link', {name: 'Queues'}).click();
    await page.getByRole('heading', {name: 'Queues', level: 1}).waitFor();
    await page.getByText('Add a new queue').click();
    const form = page.getByRole('form', {name: 'Add a new queue'});
    await form.getByLabel('Name').fill(QUEUE);
    await form.getByRole('button', {name: 'x-max-length', exact: true}).click();
    await form.locator('.kv-row').first().getByLabel('Value').fill('10000');
    await form.getByRole('button', {name: 'Add queue'}).click();
    await outcome('Add a new queue');
    await page.getByRole('searchbox').fill('ui-test');
    await page.locator('table.data tbody tr', {hasText: QUEUE}).waitFor();
    await page.waitForFunction(() => document.querySelectorAll('table.data tbody tr').length === 1);
    await shot('03-queues.png');
  });

  await step('an API error is shown under its form', async () => {
    await page.getByRole('link', {name: QUEUE, exact: true}).click();
    await page.getByRole('heading', {name: `Queue ${QUEUE}`}).waitFor();
    const publish = page.getByRole('form', {name: 'Publish message'});
    await publish.getByLabel('Payload', {exact: true}).fill('not base64!');
    await publish.getByLabel('Payload encoding').selectOption('base64');
    await publish.getByRole('button', {name: 'Publish message'}).click();
    await expectText(publish.locator('.outcome.error'), '400 bad_request: not_base64');
  });

  await step('publish a message and get it back from the queue page', async () => {
    const publish = page.getByRole('form', {name: 'Publish message'});
    await publish.getByLabel('Payload encoding').selectOption('string');
    await publish.getByLabel('Payload', {exact: true}).fill(PAYLOAD);
    await publish.locator('fieldset', {hasText: 'Headers'}).getByLabel('Header').first().fill('x-test');
    await publish.locator('fieldset', {hasText: 'Headers'}).getByLabel('Value').first().fill('browser');
    await publish.getByRole('button', {name: 'Publish message'}).click();
    console.log('   ' + await outcome('Publish message'));
    const get = page.getByRole('form', {name: 'Get messages'});
    await get.getByRole('button', {name: 'Get messages'}).click();
    await outcome('Get messages');
    const message = page.getByRole('article', {name: 'Message 1'});
    await expectText(message.locator('.payload'), PAYLOAD);
    await expectText(message, 'x-test');
  });

  await step('bind the queue to an exchange and unbind it', async () => {
    await page.getByText('Add binding to this queue').click();
    const form = page.getByRole('form', {name: 'Add binding'});
    await form.getByLabel('From exchange').fill('amq.topic');
    await form.getByLabel('Routing key').fill('ui.#');
    await form.getByRole('button', {name: 'Bind'}).click();
    await outcome('Add binding');
    const row = page.locator('table.data tbody tr', {hasText: 'amq.topic'}).filter({hasText: 'ui.#'});
    await row.waitFor();
    await shot('04-queue.png', true);
    await row.getByRole('button', {name: 'Unbind'}).click();
    await page.getByRole('dialog').getByRole('button', {name: 'Unbind'}).click();
    await row.waitFor({state: 'detached'});
  });

  await step('create a user', async () => {
    await page.getByRole('navigation', {name: 'Main'}).getByRole('link', {name: 'Admin'}).click();
    await page.getByRole('heading', {name: 'Users', level: 1}).waitFor();
    const form = page.getByRole('form', {name: 'Add or update a user'});
    await form.getByLabel('Username').fill('ui-user');
    await form.getByLabel('Password', {exact: true}).fill('ui-secret');
    await form.getByLabel('Password (again)').fill('ui-secret');
    await form.getByRole('button', {name: 'monitoring'}).click();
    await form.getByRole('button', {name: 'Add / update user'}).click();
    await outcome('Add or update a user');
    await page.locator('table.data tbody tr', {hasText: 'ui-user'}).filter({hasText: 'monitoring'}).waitFor();
    await shot('05-users.png');
  });

  await step('create a policy and see it applied to the queue', async () => {
    await page.getByRole('navigation', {name: 'Admin'}).getByRole('link', {name: 'Policies'}).click();
    await page.getByRole('heading', {name: 'Policies', level: 1}).waitFor();
    const form = page.getByRole('form', {name: 'Add or update a policy'});
    await form.getByLabel('Name').fill('ui-policy');
    await form.getByLabel('Pattern').fill('^ui-');
    await form.getByLabel('Apply to').selectOption('queues');
    await form.getByRole('button', {name: 'max-length', exact: true}).click();
    await form.locator('.kv-row').first().getByLabel('Value').fill('1000');
    await form.getByRole('button', {name: 'Add / update policy'}).click();
    await outcome('Add or update a policy');
    await page.locator('table.data tbody tr', {hasText: 'ui-policy'}).filter({hasText: 'max-length: 1000'}).waitFor();
    await shot('06-policies.png', true);
    await page.goto(`${base}/#/queues/%2F/${QUEUE}`);
    await expectText(page.locator('.facts dd'), 'ui-policy');
  });

  await step('purge and delete the queue', async () => {
    await page.getByRole('button', {name: 'Purge messages'}).click();
    await page.getByRole('dialog').getByRole('button', {name: 'Purge'}).click();
    await expectText(page.locator('.toast'), 'purged');
    await page.getByRole('button', {name: 'Delete queue'}).click();
    await page.getByRole('dialog').getByRole('button', {name: 'Delete'}).click();
    await page.waitForURL(/#\/queues$/);
    await page.getByRole('heading', {name: 'Queues', level: 1}).waitFor();
  });

  await step('every other page renders', async () => {
    const pages = [
      ['#/exchanges', 'Exchanges', '07-exchanges.png', 'amq.topic'],
      ['#/exchanges/%2F/amq.topic', 'Exchange amq.topic', '08-exchange.png', 'Bindings from this exchange'],
      ['#/connections', 'Connections', '09-connections.png', 'running'],
      ['#/channels', 'Channels', '10-channels.png', 'running'],
      ['#/vhosts', 'Virtual hosts', '11-vhosts.png', '/'],
      ['#/permissions', 'Permissions', '12-permissions.png', 'guest'],
      ['#/nodes', 'Nodes', '13-nodes.png', 'none'],
    ];
    for (const [hash, title, file, text] of pages) {
      await page.goto(base + '/' + hash);
      await page.getByRole('heading', {name: title, level: 1}).waitFor();
      await expectText(page.locator('main'), text);
      await page.waitForFunction(() => document.getElementById('page-status').textContent.startsWith('Updated'));
      const problem = page.locator('#page-problem');
      if (await problem.isVisible()) throw new Error(`${hash}: ${await problem.textContent()}`);
      await shot(file);
    }
  });

  if (secure) {
    await step("a TLS client's connection page shows its TLS details", async () => {
      await page.goto(base + '/#/connections');
      await page.locator('table.data tbody tr', {hasText: 'ui-tls'}).getByRole('link').first().click();
      await page.getByRole('heading', {name: /^Connection /, level: 1}).waitFor();
      const sec = page.locator('section.panel', {has: page.getByRole('heading', {name: 'TLS', level: 2, exact: true})});
      await expectText(sec.locator('dd'), 'yes');
      const tls = await sec.locator('dl.facts').evaluate((dl) => Object.fromEntries(
        [...dl.querySelectorAll('dt')].map((dt) => [dt.textContent, dt.nextElementSibling.textContent])));
      // RabbitMQ's four facts, in its spelling (the client is pika on TLS 1.3 or 1.2)
      const tls13 = tls['Protocol version'] === 'tlsv1.3' && tls['Key exchange algorithm'] === 'any' &&
        tls['Hash algorithm'] === 'aead';
      const tls12 = tls['Protocol version'] === 'tlsv1.2' && /^ecdhe_(rsa|ecdsa)$/.test(tls['Key exchange algorithm']) &&
        /^(aead|sha\d*)$/.test(tls['Hash algorithm']);
      if (!(tls13 || tls12) || !/^(aes_(128|256)_gcm|chacha20_poly1305)$/.test(tls['Cipher algorithm'])) {
        throw new Error(`TLS details: ${JSON.stringify(tls)}`);
      }
      if (!tls['Peer certificate'].startsWith('CN=ui-tls,OU=tls,O=hutch tests')) {
        throw new Error(`peer certificate: ${tls['Peer certificate']}`);
      }
      console.log(`   ${tls['Protocol version']}, ${tls['Key exchange algorithm']}, ${tls['Cipher algorithm']}, ` +
        `${tls['Hash algorithm']}`);
      const order = await sec.locator('dl.facts dt').allTextContents();
      if (order.slice(1, 5).join('|') !== 'Protocol version|Key exchange algorithm|Cipher algorithm|Hash algorithm') {
        throw new Error(`TLS facts out of RabbitMQ's order: ${order}`);
      }
      await page.evaluate(() => document.getElementById('toasts').replaceChildren());  // earlier steps' toasts
      await shot('14-connection-tls.png', true);
    });
  }

  await step('a monitoring user sees no admin pages', async () => {
    await page.getByRole('button', {name: 'Log out'}).click();
    await expectText(page.getByRole('alert'), 'You have logged out');
    await page.getByLabel('Username').fill('ui-user');
    await page.getByLabel('Password').fill('ui-secret');
    await page.getByRole('button', {name: 'Log in'}).click();
    const nav = page.getByRole('navigation', {name: 'Main'});
    await nav.getByRole('link', {name: 'Nodes'}).waitFor();
    if (await nav.getByRole('link', {name: 'Admin'}).count()) throw new Error('Admin is offered to a monitoring user');
    await expectText(page.locator('.session .who'), 'ui-user');
  });

  await step('formatting and rate helpers', async () => {
    const result = await page.evaluate(async () => {
      const fmt = await import('/ui/fmt.js');
      const series = await import('/ui/series.js');
      const tracker = new series.RateTracker(['publish']);
      tracker.rates({publish: 100}, 1000);
      const points = series.pointsFromSamples({messages: [{sample: 5, timestamp: 2000}, {sample: 3, timestamp: 1000}]},
        {publish: [{sample: 30, timestamp: 2000}, {sample: 10, timestamp: 1000}]});
      return {
        rates: [fmt.rate(0), fmt.rate(12.34), fmt.rate(1234.5), fmt.rate(undefined)],
        sizes: [fmt.bytes(512), fmt.bytes(1536), fmt.bytes(3 * 1024 ** 3)],
        durations: [fmt.duration(9000), fmt.duration(252000), fmt.duration(90061000)],
        delta: tracker.rates({publish: 150}, 3000).publish,
        given: tracker.rates({publish: 0, publish_details: {rate: 7.5}}, 4000).publish,
        points,
      };
    });
    const expected = {
      rates: ['0/s', '12.3/s', '1,235/s', '—'], sizes: ['512 B', '1.5 KiB', '3 GiB'], durations: ['9s', '4m 12s', '1d 1h'],
      delta: 25, given: 7.5,
      points: [{t: 1000, values: {messages: 3}}, {t: 2000, values: {messages: 5, publish: 20}}],
    };
    if (JSON.stringify(result) !== JSON.stringify(expected)) {
      throw new Error(`got ${JSON.stringify(result)}, expected ${JSON.stringify(expected)}`);
    }
  });

  if (pageErrors.length) {
    run.current = 'no script errors';
    throw new Error(pageErrors.join('\n'));
  }
  run.current = 'state-changing calls carried this origin';
  const origin = new URL(base).origin;
  const origins = await Promise.all(originHeaders);
  const foreign = origins.filter((o) => o !== origin);
  if (!origins.length || foreign.length) {
    throw new Error(`${origins.length} state-changing API calls, Origin not ${origin}: ${JSON.stringify(foreign)}`);
  }
  console.log(`ok - ${run.current} (${origins.length} POST/PUT/DELETE calls, all with Origin ${origin})`);
  console.log(`all steps passed in ${run.elapsed()} s`);
  if (failedCalls.length) console.log('API calls that failed (expected ones included):\n  ' + failedCalls.join('\n  '));
} catch (exc) {
  console.log(`FAILED - ${run.current}: ${exc.message}`);
  if (failedCalls.length) console.log('API calls that failed:\n  ' + failedCalls.join('\n  '));
  await page.screenshot({path: join(artifacts, 'failure.png'), fullPage: true}).catch(() => {});
  process.exitCode = 1;
} finally {
  await context.close();
  for (const dir of [profile, ...homes]) rmSync(dir, {recursive: true, force: true});
}
