// What the single-notebook browser scenarios share (debug.mjs, lockstep.mjs): the arguments
// (<lab url> <token> <screenshot dir> <results.json>), a headless chromium, the step recorder
// (results.json: {name: {ok, detail}}, which pytest asserts on), and the notebook's cell and stdin helpers.
import { chromium } from 'playwright-core';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const [base, token, shots, resultsFile] = process.argv.slice(2);
export const results = {};
export const record = (name, ok, detail = '') => { results[name] = { ok: !!ok, detail: String(detail) }; };
export const save = () => fs.writeFileSync(resultsFile, JSON.stringify(results, null, 2));

const userData = fs.mkdtempSync(path.join(os.tmpdir(), 'mlxj-chromium-'));
export const browser = await chromium.launchPersistentContext(userData, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1300, height: 900 },
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-dev-shm-usage',
         '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
export const page = browser.pages()[0] || await browser.newPage();

export async function step(name, fn) {
  try {
    const detail = await fn();
    if (!(name in results)) record(name, true, detail ?? '');
  } catch (e) {
    record(name, false, e && e.message ? e.message.split('\n')[0] : e);
    await page.screenshot({ path: path.join(shots, `failed-${name}.png`) }).catch(() => {});
  }
  save();
}

export const kernelIdle = () => page.waitForFunction(() => {
  const k = window.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel;
  return k && k.status === 'idle';
}, null, { timeout: 90000 });
export const runCell = (i) => page.evaluate((k) => {
  window.jupyterapp.shell.currentWidget.content.activeCellIndex = k;
  return window.jupyterapp.commands.execute('notebook:run-cell');
}, i);
export const cellText = (i) => page.evaluate((k) => window.jupyterapp.shell.currentWidget.content.widgets[k].node
  .querySelector('.jp-Cell-outputWrapper')?.innerText ?? '', i);

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
