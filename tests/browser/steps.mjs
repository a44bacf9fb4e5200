// What the browser specs (ui.spec.mjs, operator.spec.mjs, streams.spec.mjs) share: Chromium's flags, the
// step runner that prints "ok - <step>" (and remembers the step a failure happened in), the check that
// ends a run, and the outcome line of a form (forms.js: actionForm).

// Without these flags Chromium reaches out to the network (updates, field trials, QUIC probes).
export const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
  '--disable-quic', '--no-first-run', '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'];

/** Steps that print "ok - name (1.2 s)"; `.current` names the step running (for "FAILED - <step>"). */
export function stepper() {
  const run = {current: 'start', started: Date.now()};
  run.step = async (name, fn) => {
    run.current = name;
    const t0 = Date.now();
    await fn();
    console.log(`ok - ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  };
  run.elapsed = () => ((Date.now() - run.started) / 1000).toFixed(1);
  return run;
}

/** After the last step: fail on any script error the page reported, else say that every step passed. */
export function allPassed(run, pageErrors) {
  if (pageErrors.length) {
    run.current = 'no script errors';
    throw new Error(pageErrors.join('\n'));
  }
  console.log(`all steps passed in ${run.elapsed()} s`);
}

/** Wait for an element of `locator` holding `text`. */
export const expectText = (locator, text) => locator.filter({hasText: text}).first().waitFor();

/** The outcome line of the form labelled `label` on `page`, once the form has run: {ok, text}. */
export async function formOutcome(page, label) {
  const line = page.getByRole('form', {name: label}).locator('.outcome');
  await page.waitForFunction((el) => /\b(ok|error)\b/.test(el.className), await line.elementHandle());
  return {ok: !(await line.getAttribute('class')).includes('error'), text: await line.textContent()};
}

/** The outcome text of a form that must have succeeded (else throw with its error). */
export async function succeeded(page, label) {
  const {ok, text} = await formOutcome(page, label);
  if (!ok) throw new Error(`${label}: ${text}`);
  return text;
}
