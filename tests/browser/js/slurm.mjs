// Drives JupyterLab in headless chromium through a Slurm cluster on the bed: its card in the MLX Cluster panel
// and its dashboard tab show the Slurm job (id, state, nodes, time left), light and dark; then it stops and its
// job leaves the queue. Usage: node slurm.mjs <lab url> <token> <screenshot dir> <results.json>
// (SLURM_CONF in the environment: squeue here asks the bed). Each check lands in results.json ({name: {ok, detail}}).
import { execFileSync } from 'node:child_process';
import { base, finish, logs, openNotebook, page, pin, record, run, runToEnd, shot, start, step }
  from './scenario.mjs';

const JOB_GONE_MS = 30000;   // the job leaves the queue within this after the cluster's stop
const IDLE_MS = 120000;      // a cell's end (the Slurm allocation's wait included)

await start({ viewport: { width: 1400, height: 900 }, prefix: 'failed-slurm-' });
const failed = [];   // which resource a "Failed to load resource" error was
page.on('response', (r) => { if (r.status() >= 400) failed.push(`${r.status()} ${r.request().method()} ${r.url().replace(/token=\w+/, 'token=…')}`); });

// the bed's queue: "jobid state nodes" lines
const queue = () => execFileSync('squeue', ['--noheader', '--format=%i %T %N'], { encoding: 'utf8', timeout: 20000 }).trim();

const panel = page.locator('#mlx-jupyter-cluster-panel');
const TIME_LEFT = /^(\d+ min( \d+ s)?|\d+ s)$/;
// the state as squeue's word (the nodes have a row of their own); the card's line names the nodes once
const STATE = /^RUNNING$/;
const JOB_LINE = /^Slurm job (\d+) · RUNNING on node\[1-2\] · (.+) left$/;
// the ranks' hosts are the job's nodes (not the 127.0.0.1 of a cluster without hosts)
const SUB = /^ring · 2 ranks · node1, node2( ·|$)/;
// ranks on the nodes: ok by the owning notebook's record (the server cannot look at a pid there)
const HEALTH = /^2 of 2 ranks ok \(on node1, node2\), idle$/;
let jobId = '';
let clusterId = '';

async function themeTo(name, light) {
  await run('apputils:change-theme', { theme: name });
  await page.waitForFunction((l) => document.body.dataset.jpThemeLight === l, light, { timeout: 20000 });
}

try {
  await step('slurm_cluster_starts', async () => {
    await openNotebook('slurm.ipynb');
    await pin();   // the dashboard tab becomes the current widget later
    const text = await runToEnd(0, IDLE_MS);
    const m = /2 ranks ready in .*Slurm job (\d+) on node1,node2/.exec(text);
    if (!m) throw new Error(`the Slurm cluster did not start: ${JSON.stringify(text.slice(-800))}`);
    jobId = m[1];
    const q = queue();
    if (!new RegExp(`^${jobId} RUNNING node\\[1-2\\]$`, 'm').test(q)) throw new Error(`squeue: ${JSON.stringify(q)}`);
    return `job ${jobId}; squeue: ${q}`;
  });

  await step('panel_card_shows_the_job', async () => {
    await page.locator('.jp-SideBar .lm-TabBar-tab[data-id="mlx-jupyter-cluster-panel"]').click();
    const line = panel.locator('.mlxj-card .mlxj-card-slurm').first();
    await line.waitFor({ timeout: 20000 });
    const card = panel.locator('.mlxj-card', { has: page.locator('.mlxj-card-slurm') }).first();
    clusterId = await card.getAttribute('data-cluster');
    // the panel refreshes by itself: wait for squeue's RUNNING state and a time left on the line
    await page.waitForFunction(() => / · RUNNING.* left$/.test(
      document.querySelector('#mlx-jupyter-cluster-panel .mlxj-card-slurm')?.textContent || ''), null, { timeout: 20000 });
    const text = await line.innerText();
    const owner = await card.locator('.mlxj-card-owner').innerText();
    const sub = await card.locator('.mlxj-card-sub').first().innerText();
    const health = await card.locator('.mlxj-card-health').innerText();
    const cells = await card.locator('table.mlxj-ranks tr').evaluateAll((trs) => trs.map((tr) => tr.innerText.replace(/\s+/g, ' ').trim()));
    const m = JOB_LINE.exec(text.trim());
    await panel.screenshot({ path: shot('slurm-panel.png') });
    await page.screenshot({ path: shot('slurm-lab.png') });
    const rows = cells.slice(1);
    record('panel_card_shows_the_job', m && m[1] === jobId && TIME_LEFT.test(m[2]) && /slurm\.ipynb/.test(owner)
      && SUB.test(sub.trim()) && HEALTH.test(health.trim()) && rows.length === 2
      && rows.every((r) => / ok idle$/.test(r) && !/remote/.test(r)),
      `card ${clusterId}: ${text} | ${sub} | ${health} | rows ${JSON.stringify(rows)} | owner: ${owner} | squeue's job ${jobId}`);
  });

  await step('dashboard_shows_the_job', async () => {
    const card = panel.locator(`.mlxj-card[data-cluster="${clusterId}"]`);
    await card.locator('button.mlxj-open-dashboard').click();
    const dash = page.locator('.mlxj-dashboard');
    await dash.locator('.mlxj-dash-slurm').waitFor({ timeout: 20000 });
    const read = () => dash.locator('.mlxj-dash-slurm').evaluate((dl) => Object.fromEntries(
      ['Slurm-job', 'state', 'nodes', 'time-left'].map((k) => [k, dl.querySelector(`.mlxj-dash-slurm-${k}`)?.textContent ?? null])));
    const job = await read();
    const title = await dash.locator('.mlxj-dash-title').innerText();
    const sub = await dash.locator('.mlxj-dash-sub').first().innerText();
    const rows = await dash.locator('table.mlxj-dash-ranks tr[data-rank]').evaluateAll((trs) => trs.map((tr) => ({
      host: tr.querySelector('.mlxj-dash-host')?.textContent, health: tr.querySelector('.mlxj-col-health')?.textContent,
      state: tr.querySelector('.mlxj-dash-state')?.textContent })));
    await dash.screenshot({ path: shot('slurm-dashboard.png') });
    await page.screenshot({ path: shot('slurm-dashboard-lab.png') });
    const ok = job['Slurm-job'] === jobId && STATE.test(job.state || '') && job.nodes === 'node[1-2]'
      && TIME_LEFT.test(job['time-left'] || '') && title.includes(clusterId) && SUB.test(sub.trim())
      && JSON.stringify(rows) === JSON.stringify([{ host: 'node1', health: 'ok', state: 'idle' },
                                                  { host: 'node2', health: 'ok', state: 'idle' }]);
    record('dashboard_shows_the_job', ok, `${title}: ${JSON.stringify(job)} | ${sub} | ranks ${JSON.stringify(rows)}`);
  });

  await step('dark_theme', async () => {
    // JupyterLab's dark theme: the card's job line and the dashboard's job list stay readable (theme colours)
    const look = () => page.evaluate(() => {
      const line = document.querySelector('#mlx-jupyter-cluster-panel .mlxj-card-slurm');
      const dd = document.querySelector('.mlxj-dashboard .mlxj-dash-slurm-Slurm-job');
      return { card: line ? getComputedStyle(line).color : '', dd: dd ? getComputedStyle(dd).color : '',
               bg: getComputedStyle(document.querySelector('.mlxj-dashboard')).backgroundColor };
    });
    const light = await look();
    await themeTo('JupyterLab Dark', 'false');
    await page.waitForFunction((bg) => getComputedStyle(document.querySelector('.mlxj-dashboard')).backgroundColor !== bg,
                               light.bg, { timeout: 10000 });
    const dark = await look();
    await page.locator('.mlxj-dashboard').screenshot({ path: shot('slurm-dashboard-dark.png') });
    await panel.screenshot({ path: shot('slurm-panel-dark.png') });
    await page.screenshot({ path: shot('slurm-lab-dark.png') });
    const text = await panel.locator('.mlxj-card-slurm').first().innerText();
    const job = await page.locator('.mlxj-dashboard .mlxj-dash-slurm-Slurm-job').innerText();
    await themeTo('JupyterLab Light', 'true');
    record('dark_theme', light.card !== dark.card && light.dd !== dark.dd && text.includes(`Slurm job ${jobId}`) && job === jobId,
      `light ${JSON.stringify(light)} dark ${JSON.stringify(dark)}: ${text}`);
  });

  await step('slurm_cluster_stops', async () => {
    // the panel offers Stop for the clusters its server started; a kernel's cluster stops in its notebook
    const card = panel.locator(`.mlxj-card[data-cluster="${clusterId}"]`);
    const stopButtons = await card.locator('button.mlxj-stop').count();
    const said = await runToEnd(1, IDLE_MS);
    const stopped = Date.now();
    await card.waitFor({ state: 'detached', timeout: 20000 });
    const end = Date.now() + JOB_GONE_MS;
    let q = queue();
    while (q && Date.now() < end) {
      await new Promise((r) => setTimeout(r, 200));  // polling squeue, bounded by JOB_GONE_MS
      q = queue();
    }
    const emptyAfter = Date.now() - stopped;
    // the open dashboard tab asks once more, hears 404 and says the cluster is gone
    await page.waitForFunction((id) => (document.querySelector('.mlxj-dashboard')?.textContent || '').includes(`${id} is gone`),
                               clusterId, { timeout: 10000 });
    const dashSays = await page.locator('.mlxj-dashboard .mlxj-dash-error').innerText();
    await page.screenshot({ path: shot('slurm-stopped.png') });
    record('slurm_cluster_stops', /cluster stopped/.test(said) && q === '',
      `stop buttons on the kernel's card: ${stopButtons}; cell: ${said.trim()}; squeue ${JSON.stringify(q)} ${emptyAfter} ms after the stop cell; `
      + `dashboard: ${dashSays.slice(0, 200)}`);
  });

  await step('console_errors', async () => {
    // benign: the dashboard's 404 for the stopped cluster (how it learns the cluster is gone)
    const gone404 = (f) => f.startsWith(`404 GET ${base}mlx-jupyter/clusters/${clusterId}/dashboard`);
    const errors = failed.every(gone404)
      ? logs.filter((l) => !/^Failed to load resource: the server responded with a status of 404 \(Not Found\)$/.test(l)) : logs;
    record('console_errors', errors.length === 0, `${errors.slice(0, 10).join(' | ') || 'none'} (of ${logs.length}); failed: ${failed.slice(0, 10).join(' | ')}`);
  });
} finally {
  await finish();
}
