// Browser test of the web UI's stream pages: headless Debian chromium driven by playwright-core.
//
//   EXPECTED='{"stream": ..., "node": ..., "last": N, "segments": N, "held_offset": N, "held_lag": N}' \
//     node streams.spec.mjs BASE_URL ARTIFACTS_DIR
//
// Run by tests/browser/test_ui_streams.py, which starts the node, writes the stream with pika and rstream,
// keeps an rstream consumer, an rstream producer and a pika consumer that never acknowledges on it, and
// passes what the pages must show (EXPECTED, read from the API before the run). Each step prints
// "ok - <step>"; a failure prints "FAILED - <step>: <error>", saves failure.png and exits 1. Screenshots
// of every page go to ARTIFACTS_DIR.

import {mkdtempSync, rmSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {join} from 'node:path';
import {chromium} from 'playwright-core';
import {allPassed, CHROMIUM_ARGS, stepper} from './steps.mjs';

const [base, artifacts] = process.argv.slice(2);
const want = JSON.parse(process.env.EXPECTED || 'null');
if (!base || !artifacts || !want) {
  console.error('usage: EXPECTED=JSON node streams.spec.mjs BASE_URL ARTIFACTS_DIR');
  process.exit(2);
}

const profile = mkdtempSync(join(tmpdir(), 'hutch-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: CHROMIUM_ARGS, headless: true,
  viewport: {width: 1440, height: 900},
});
context.setDefaultTimeout(10000);
const page = context.pages()[0] || await context.newPage();
const pageErrors = [];
page.on('pageerror', (e) => pageErrors.push(e.message));
page.on('console', (m) => {
  if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) pageErrors.push(m.text());
});
const deletes = [];  // the DELETE calls the pages made, with their Origin header (the API's same-origin rule)
page.on('request', (r) => {
  if (r.method() === 'DELETE') deletes.push({url: r.url(), origin: r.headerValue('origin')});
});

const run = stepper();
const step = run.step;
const shot = (name) => page.screenshot({path: join(artifacts, name), fullPage: true});

async function settled(title) {
  await page.getByRole('heading', {name: title, level: 1}).waitFor();
  await page.waitForFunction(() => document.getElementById('page-status').textContent.startsWith('Updated'));
  const problem = page.locator('#page-problem');
  if (await problem.isVisible()) throw new Error(`${title}: ${await problem.textContent()}`);
}

/** The cells of the first row of the table labelled `label` that contains `text` (with `exact`: an element
 * whose whole text it is), by column heading. */
async function rowOf(label, text, exact = false) {
  const table = page.getByRole('table', {name: label});
  const row = table.locator('tbody tr', exact ? {has: page.getByText(text, {exact: true})} : {hasText: text}).first();
  await row.waitFor();
  const heads = await table.locator('thead th').allTextContents();
  const cells = await row.locator('th, td').allTextContents();
  return Object.fromEntries(heads.map((head, i) => [head.replace(/[▲▼]/g, '').trim(), (cells[i] || '').trim()]));
}

function same(what, got, expected) {
  if (String(got) !== String(expected)) throw new Error(`${what}: got ${JSON.stringify(got)}, expected ${JSON.stringify(expected)}`);
}

const fmt = (n) => Number(n).toLocaleString('en-US');

try {
  await step('log in', async () => {
    await page.goto(base + '/');
    await page.getByLabel('Username').fill('guest');
    await page.getByLabel('Password').fill('guest');
    await page.getByRole('button', {name: 'Log in'}).click();
    await page.getByRole('heading', {name: 'Overview', level: 1}).waitFor();
    await page.locator('#refresh-every').selectOption('2000');
  });

  await step('the Streams page lists the stream with its leader, offsets, segments and clients', async () => {
    await page.getByRole('navigation', {name: 'Main'}).getByRole('link', {name: 'Streams'}).click();
    await settled('Streams');
    const row = await rowOf('Streams', want.stream);
    same('leader', row.Leader, want.node);
    same('offsets', row.Offsets, `0 / ${fmt(want.last)} / ${fmt(want.last)}`);
    same('segments', row.Segments, want.segments);
    same('AMQP consumers', row['AMQP consumers'], 1);
    same('stream consumers', row['Stream consumers'], 1);
    same('publishers', row.Publishers, 1);
    await shot('streams-1440.png');
  });

  await step("a stream's page: every consumer with its offset, lag and credit, and the publisher", async () => {
    await page.getByRole('link', {name: want.stream, exact: true}).click();
    await settled(`Stream ${want.stream}`);
    const held = await rowOf('Consumers', 'ui-held');
    same('AMQP consumer protocol', held.Protocol, 'AMQP 0-9-1');
    same('AMQP consumer offset', held.Offset, want.held_offset);
    same('AMQP consumer lag', held.Lag, fmt(want.held_lag));
    same('AMQP consumer credit', held.Credit, 0);
    const sub = await rowOf('Consumers', 'subscription');
    same('subscription protocol', sub.Protocol, 'stream');
    same('subscription lag', sub.Lag, '0');
    same('subscription offset', sub.Offset, fmt(want.last + 1));
    const pub = await rowOf('Publishers', 'ui-ref');
    if (!pub.Connection.includes('->')) throw new Error(`publisher connection: ${pub.Connection}`);
    const details = await page.locator('dl.facts').first().evaluate((dl) => Object.fromEntries(
      [...dl.querySelectorAll('dt')].map((dt) => [dt.textContent, dt.nextElementSibling.textContent])));
    same('first offset', details['First offset'], 0);
    same('last offset', details['Last offset'], fmt(want.last));
    same('members', details.Members, want.node);
    same('retention', details.Retention, 'max age 7D');
    await shot('stream-1440.png');
  });

  let closedName = '';
  await step('the stream connections, and closing one from its page', async () => {
    await page.getByRole('navigation', {name: 'Main'}).getByRole('link', {name: 'Streams'}).click();
    await settled('Streams');
    await page.getByRole('navigation', {name: 'Streams'}).getByRole('link', {name: 'Stream connections'}).click();
    await settled('Stream connections');
    const producer = await rowOf('Stream connections', 'ui-producer', true);
    same('producer publishers', producer.Publishers, 1);
    const consumer = await rowOf('Stream connections', 'ui-consumer', true);
    same('consumer subscriptions', consumer.Consumers, 1);
    await shot('stream-connections-1440.png');
    closedName = producer.Name;
    await page.getByRole('link', {name: closedName, exact: true}).click();
    await settled(`Stream connection ${closedName}`);
    await page.getByRole('table', {name: 'Publishers'}).locator('tbody tr', {hasText: want.stream}).waitFor();
    await shot('stream-connection-1440.png');
    await page.getByRole('button', {name: 'Close this connection'}).click();
    await page.getByRole('dialog').getByRole('button', {name: 'Close connection'}).click();
    await settled('Stream connections');
    await page.waitForFunction((name) => ![...document.querySelectorAll('table.data tbody tr th')]
      .some((th) => th.textContent === name), closedName);
    const origins = await Promise.all(deletes.map((d) => d.origin));
    if (deletes.length !== 1 || origins[0] !== new URL(base).origin) {
      throw new Error(`DELETE calls: ${JSON.stringify(deletes.map((d) => d.url))}, origins ${origins}`);
    }
  });

  allPassed(run, pageErrors);
} catch (exc) {
  console.log(`FAILED - ${run.current}: ${exc.message}`);
  await page.screenshot({path: join(artifacts, 'failure.png'), fullPage: true}).catch(() => {});
  process.exitCode = 1;
} finally {
  await context.close();
  rmSync(profile, {recursive: true, force: true});
}
