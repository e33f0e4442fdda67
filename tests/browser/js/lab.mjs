// Drives JupyterLab in Debian's headless chromium: the MLX Cluster panel and the topology widget.
// Usage: node lab.mjs <lab url> <token> <screenshot dir> <results.json>
// Each check is recorded in results.json ({name: {ok, detail}}); pytest asserts on them.
import { chromium } from 'playwright-core';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const [base, token, shots, resultsFile] = process.argv.slice(2);
const results = {};
const record = (name, ok, detail = '') => { results[name] = { ok: !!ok, detail: String(detail) }; };
const save = () => fs.writeFileSync(resultsFile, JSON.stringify(results, null, 2));
const shot = (name) => path.join(shots, name);

const userData = fs.mkdtempSync(path.join(os.tmpdir(), 'mlxj-chromium-'));
// a fresh profile each run (playwright-core wants it as launchPersistentContext's argument)
const browser = await chromium.launchPersistentContext(userData, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1500, height: 1000 },
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-dev-shm-usage',
         '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const page = browser.pages()[0] || await browser.newPage();
const logs = [];
page.on('console', (m) => { if (m.type() === 'error') logs.push(m.text()); });
page.on('pageerror', (e) => logs.push(String(e)));

const t0 = Date.now();
async function step(name, fn) {
  try {
    console.log(`${((Date.now() - t0) / 1000).toFixed(1)} s: ${name}`);
    const detail = await fn();
    if (!(name in results)) record(name, true, detail ?? '');
  } catch (e) {
    record(name, false, e && e.message ? e.message.split('\n')[0] : e);
    await page.screenshot({ path: shot(`failed-${name}.png`) }).catch(() => {});
  }
  save();
}

const run = (cmd, args = {}) => page.evaluate(([c, a]) => window.jupyterapp.commands.execute(c, a), [cmd, args]);

try {
  await step('lab_loads', async () => {
    await page.goto(`${base}lab/tree/topology.ipynb?reset&token=${token}`);
    await page.waitForSelector('#jp-main-dock-panel', { timeout: 60000 });
    await page.waitForFunction(() => window.jupyterapp && window.jupyterapp.shell, null, { timeout: 60000 });
    await page.waitForSelector('.jp-Notebook .jp-Cell', { timeout: 60000 });
    // older settings may still ask which kernel to start
    const dialog = page.locator('.jp-Dialog .jp-mod-accept');
    if (await dialog.count()) await dialog.first().click();
  });

  await step('topology_widgets_render', async () => {
    // the notebook's kernel must be up before "run all" (a fresh session starts it asynchronously)
    await page.evaluate(async () => {
      const nb = window.jupyterapp.shell.currentWidget;
      await nb.sessionContext.ready;
    });
    await page.waitForFunction(() => {
      const k = window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel;
      return k && k.status === 'idle';
    }, null, { timeout: 60000 });
    // not awaited: the command's promise follows the kernel, the page is what we wait on
    run('notebook:run-all-cells').catch((e) => logs.push(`run-all-cells: ${e}`));
    await page.waitForFunction(() => document.querySelectorAll('.mlxj-topology svg.mlxj-graph').length >= 2,
                               null, { timeout: 60000 });
  });

  const widgets = page.locator('.mlxj-topology');
  await step('mesh_widget', async () => {
    const mesh = widgets.nth(0);
    await mesh.scrollIntoViewIfNeeded();
    const cables = await mesh.locator('g.mlxj-cable').count();
    const missing = await mesh.locator('g.mlxj-missing').count();
    const hosts = await mesh.locator('g.mlxj-host').count();
    const badge = await mesh.locator('.mlxj-badge').innerText();
    await mesh.screenshot({ path: shot('topology-four-mac-mesh.png') });
    const ok = cables === 6 && missing === 0 && hosts === 4 && badge.trim() === 'jaccl';
    record('mesh_widget', ok, `hosts=${hosts} cables=${cables} missing=${missing} backend=${badge}`);
  });

  await step('broken_mesh_widget', async () => {
    const broken = widgets.nth(1);
    await broken.scrollIntoViewIfNeeded();
    const cables = await broken.locator('g.mlxj-cable').count();
    const missing = await broken.locator('g.mlxj-missing').count();
    const badge = (await broken.locator('.mlxj-badge').innerText()).trim();
    const diag = await broken.locator('.mlxj-diagnosis li').allInnerTexts();
    await broken.screenshot({ path: shot('topology-broken-mesh.png') });
    const ok = cables === 5 && missing === 1 && badge === 'jaccl-ring' && diag.length === 1 && diag[0].includes('m3-ultra-1');
    record('broken_mesh_widget', ok, `cables=${cables} missing=${missing} backend=${badge} diagnosis=${diag}`);
  });

  await step('host_click_selects', async () => {
    const broken = widgets.nth(1);
    await broken.locator('g.mlxj-host[data-host="m3-ultra-2"]').click();
    await broken.locator('g.mlxj-host.mlxj-selected').waitFor({ timeout: 5000 });
    const heading = await broken.locator('.mlxj-setup .mlxj-heading').innerText();
    await broken.screenshot({ path: shot('topology-broken-mesh-host-selected.png') });
    record('host_click_selects', heading.includes('m3-ultra-2'), heading);
  });

  await step('save_button', async () => {
    const broken = widgets.nth(1);
    await broken.locator('.mlxj-btn-save').click();
    await broken.locator('.mlxj-status-success').waitFor({ timeout: 20000 });
    return await broken.locator('.mlxj-status-text').innerText();
  });

  await step('panel_renders', async () => {
    await page.locator('.jp-SideBar .lm-TabBar-tab[data-id="mlx-jupyter-cluster-panel"]').click();
    await page.locator('#mlx-jupyter-cluster-panel .mlxj-empty').waitFor({ timeout: 20000 });
    await page.screenshot({ path: shot('panel-empty.png') });
  });

  await step('panel_start', async () => {
    const panel = page.locator('#mlx-jupyter-cluster-panel');
    await panel.locator('input.mlxj-n').fill('2');
    await panel.locator('button.mlxj-start').click();
    await panel.locator('.mlxj-card .mlxj-pill-running').waitFor({ timeout: 60000 });
    await page.waitForFunction(() => document.querySelectorAll('#mlx-jupyter-cluster-panel .mlxj-ranks tr.mlxj-health-ok').length === 2,
                               null, { timeout: 30000 });
    await page.screenshot({ path: shot('panel-running.png') });
    return await panel.locator('.mlxj-card').innerText();
  });

  await step('panel_insert_code', async () => {
    const panel = page.locator('#mlx-jupyter-cluster-panel');
    await page.locator('.jp-Notebook .jp-Cell').first().click();
    await panel.locator('button.mlxj-insert').click();
    await page.waitForFunction(() => [...document.querySelectorAll('.jp-Notebook .jp-Cell .cm-content')]
      .some((c) => c.textContent.includes('ipp.Client(cluster_id=')), null, { timeout: 10000 });
  });

  await step('panel_stop', async () => {
    const panel = page.locator('#mlx-jupyter-cluster-panel');
    await panel.locator('button.mlxj-stop').click();
    await panel.locator('.mlxj-empty').waitFor({ timeout: 30000 });
    await page.screenshot({ path: shot('panel-stopped.png') });
  });
} finally {
  record('console_errors', true, logs.slice(0, 20).join(' | '));
  save();
  await browser.close();
  fs.rmSync(userData, { recursive: true, force: true });
}
