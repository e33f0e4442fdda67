// What the browser scenarios share (lab.mjs, slurm.mjs, debug.mjs, lockstep.mjs): the arguments
// (<lab url> <token> <screenshot dir> <results.json> [more]), a headless chromium (start()), the step recorder
// (results.json: {name: {ok, detail}}, which pytest asserts on), the page's console errors, and the notebook's
// open, cell and stdin helpers. The notebook is the current one, or the one pin() kept (when tabs change).
import { chromium } from 'playwright-core';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const [base, token, shots, resultsFile, ...more] = process.argv.slice(2);
export const results = {};
export const record = (name, ok, detail = '') => { results[name] = { ok: !!ok, detail: String(detail) }; };
export const save = () => fs.writeFileSync(resultsFile, JSON.stringify(results, null, 2));
export const shot = (name) => path.join(shots, name);
export const logs = [];   // the page's console errors and uncaught exceptions

export let browser;
export let page;
let userData;
let failedPrefix = 'failed-';

// Launch chromium on a fresh profile (playwright-core wants it as launchPersistentContext's argument);
// a failed step's screenshot is `<prefix><step>.png`.
export async function start({ viewport = { width: 1300, height: 900 }, prefix = 'failed-' } = {}) {
  failedPrefix = prefix;
  userData = fs.mkdtempSync(path.join(os.tmpdir(), 'mlxj-chromium-'));
  browser = await chromium.launchPersistentContext(userData, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    viewport,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-dev-shm-usage',
           '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  page = browser.pages()[0] || await browser.newPage();
  page.on('console', (m) => { if (m.type() === 'error') logs.push(m.text()); });
  page.on('pageerror', (e) => logs.push(String(e)));
}

// The results written, chromium closed, its profile removed.
export async function finish() {
  console.log(`${((Date.now() - t0) / 1000).toFixed(1)} s: the steps are done`);
  save();
  await browser?.close();
  if (userData) fs.rmSync(userData, { recursive: true, force: true });
}

const t0 = Date.now();
export async function step(name, fn) {
  try {
    console.log(`${((Date.now() - t0) / 1000).toFixed(1)} s: ${name}`);
    const detail = await fn();
    if (!(name in results)) record(name, true, detail ?? '');
  } catch (e) {
    record(name, false, e && e.message ? e.message.split('\n')[0] : e);
    await page.screenshot({ path: shot(`${failedPrefix}${name}.png`) }).catch(() => {});
  }
  save();
}

export const run = (cmd, args = {}) => page.evaluate(([c, a]) => window.jupyterapp.commands.execute(c, a), [cmd, args]);

// Open notebook `name` in a fresh workspace, once JupyterLab and its cells are up.
export async function openNotebook(name) {
  await page.goto(`${base}lab/tree/${name}?reset&token=${token}`);
  await page.waitForFunction(() => window.jupyterapp && window.jupyterapp.shell, null, { timeout: 60000 });
  await page.waitForSelector('.jp-Notebook .jp-Cell', { timeout: 60000 });
  // older settings may still ask which kernel to start
  const dialog = page.locator('.jp-Dialog .jp-mod-accept');
  if (await dialog.count()) await dialog.first().click();
}

// Keep the current notebook as the one the helpers below act on (other tabs may become current); not
// lab.mjs's own window.mlxjNotebook, which pins the topology notebook for its dashboard steps.
export const pin = () => page.evaluate(() => { window.mlxjPinned = window.jupyterapp.shell.currentWidget; });

// The notebook's kernel is idle (started and done with whatever ran).
export const kernelIdle = (ms = 90000) => page.waitForFunction(() => {
  const nb = window.mlxjPinned || window.jupyterapp.shell.currentWidget;
  const k = nb?.sessionContext?.session?.kernel;
  return k && k.status === 'idle';
}, null, { timeout: ms });
export const runCell = (i) => page.evaluate((k) => {
  const pinned = window.mlxjPinned;
  if (pinned) window.jupyterapp.shell.activateById(pinned.id);
  (pinned || window.jupyterapp.shell.currentWidget).content.activeCellIndex = k;
  return window.jupyterapp.commands.execute('notebook:run-cell');
}, i);
export const cellText = (i) => page.evaluate((k) => (window.mlxjPinned || window.jupyterapp.shell.currentWidget)
  .content.widgets[k].node.querySelector('.jp-Cell-outputWrapper')?.innerText ?? '', i);

// Cell `i` run once the kernel is idle, until it is idle again; its output.
export async function runToEnd(i, ms = 90000) {
  await kernelIdle(ms);
  await runCell(i);
  await kernelIdle(ms);
  return cellText(i);
}

// Answer the stdin box that is open now with `line`; returns its prompt.
export async function answer(line) {
  const input = page.locator('input.jp-Stdin-input').last();
  await input.waitFor({ state: 'visible', timeout: 60000 });
  const prompt = await page.locator('.jp-Stdin-prompt').last().innerText();
  const box = await input.elementHandle();
  await box.fill(line);
  await box.press('Enter');
  await box.waitForElementState('hidden', { timeout: 30000 });  // answered: the box turns into text
  return prompt;
}

// The pdb scenarios' last step: the cluster's stop cell `i`; a pdb session left open (`open`) is ended
// first by the stop button.
export async function stopAfterPdb(i, open) {
  if (open) {
    await run('notebook:interrupt-kernel');
    await kernelIdle();
  }
  await runCell(i);
  await kernelIdle();
}
