// Drives JupyterLab in Debian's headless chromium: the MLX Cluster panel and the topology widget.
// Usage: node lab.mjs <lab url> <token> <screenshot dir> <results.json> <release flag file>
// Each check is recorded in results.json ({name: {ok, detail}}); pytest asserts on them.
import fs from 'node:fs';
import path from 'node:path';
import { finish, kernelIdle as idle, logs, more, openNotebook, page, record, resultsFile, run, runCell, shot, start, step }
  from './scenario.mjs';

const [releaseFlag] = more;
// Console errors known to be harmless, each with why. Anything else fails console_errors.
const BENIGN = [
  // panel_form_validation: the server refuses a bad host name (400, its message shown under the field)
  /^Failed to load resource: the server responded with a status of 400 \(Bad Request\)$/,
];
await start({ viewport: { width: 1500, height: 1000 } });

// Linux: a pid is gone when /proc has no entry or the process is a zombie; elsewhere kill(pid, 0).
function alive(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return !/^\d+ \(.*\) Z/.test(stat);
  } catch (e) {
    if (fs.existsSync('/proc/self/stat')) return false;
  }
  try { process.kill(pid, 0); return true; } catch (e) { return e.code === 'EPERM'; }
}

async function waitGone(pids, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (!pids.some(alive)) return;
    await new Promise((r) => setTimeout(r, 100));  // polling /proc, bounded by ms
  }
  throw new Error(`rank processes still alive ${ms / 1000} s after stop: ${pids.filter(alive)}`);
}

// The current notebook's kernel is idle (started and done with whatever ran).
const kernelIdle = () => idle(60000);

// Run cells [0, upto) of the current notebook (run-all-above runs those above the active cell).
const runAbove = (upto) => page.evaluate((i) => {
  window.jupyterapp.shell.currentWidget.content.activeCellIndex = i;
  return window.jupyterapp.commands.execute('notebook:run-all-above');
}, upto);
// a new cell below the active one holding ``src``; its index
const insertCellBelow = (src) => page.evaluate((code) => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  return window.jupyterapp.commands.execute('notebook:insert-cell-below').then(() => {
    nb.activeCell.model.sharedModel.setSource(code);
    return nb.activeCellIndex;
  });
}, src);

// The panel's layout: no clipped cell, no wrapped label (what the eye caught in earlier screenshots).
async function panelLayout() {
  return page.evaluate(() => {
    const panel = document.querySelector('#mlx-jupyter-cluster-panel');
    const bad = [];
    for (const card of panel.querySelectorAll('.mlxj-card')) {
      if (card.scrollWidth > card.clientWidth + 1) bad.push(`card ${card.dataset.cluster} scrolls (${card.scrollWidth} > ${card.clientWidth})`);
      for (const td of card.querySelectorAll('td')) {
        if (td.scrollWidth > td.clientWidth + 1) bad.push(`cell '${td.textContent}' clipped`);
      }
    }
    const labels = [...panel.querySelectorAll('.mlxj-label')];
    const h = Math.min(...labels.map((l) => l.getBoundingClientRect().height));
    for (const l of labels) {
      if (l.getBoundingClientRect().height > h * 1.5) bad.push(`label '${l.textContent}' wraps`);
    }
    return bad;
  });
}

async function rankRows(selector) {
  return page.locator(selector).evaluateAll((trs) => trs.map((tr) => {
    const cell = (c) => tr.querySelector(`.mlxj-col-${c}`)?.textContent ?? null;
    return { pid: Number(tr.dataset.pid), rank: cell('rank'), health: cell('health'), state: cell('state'), memory: cell('memory') };
  }));
}

try {
  await step('lab_loads', async () => {
    await openNotebook('topology.ipynb');
    await page.waitForSelector('#jp-main-dock-panel', { timeout: 60000 });
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

  await step('check_cables_button', async () => {
    // before Apply setup the plan's addresses are not on the cables: every check fails, saying so
    const broken = widgets.nth(1);
    const statusText = () => broken.locator('.mlxj-status-text').innerText();
    await broken.locator('.mlxj-btn-check').click();
    await page.waitForFunction(() => document.querySelectorAll('.mlxj-topology')[1]
      .querySelectorAll('g.mlxj-cable.mlxj-check-failed').length === 5, null, { timeout: 30000 });
    await broken.locator('.mlxj-status-error').waitFor({ timeout: 10000 });
    const before = await statusText();
    const tip = await broken.locator('g.mlxj-check-failed title').first().textContent();
    await broken.screenshot({ path: shot('topology-check-cables-before-setup.png') });
    // then Apply setup, and the recorded Macs answer with their measurements: one slow cable
    await broken.locator('.mlxj-btn-apply').click();
    await page.waitForFunction(() => /^set up 4 of 4 hosts/.test(
      document.querySelectorAll('.mlxj-topology')[1].querySelector('.mlxj-status-text').textContent), null, { timeout: 20000 });
    await broken.locator('.mlxj-btn-check').click();
    await page.waitForFunction(() => document.querySelectorAll('.mlxj-topology')[1]
      .querySelectorAll('g.mlxj-cable.mlxj-check-ok').length === 4, null, { timeout: 30000 });
    const flagged = await broken.locator('g.mlxj-check-flagged').count();
    const labels = await broken.locator('text.mlxj-check-label').allTextContents();
    const status = await statusText();
    const legend = await broken.locator('.mlxj-legend').textContent();
    await broken.screenshot({ path: shot('topology-check-cables.png') });
    const ok = before.endsWith('press Apply setup, then Check cables') && tip.includes('apply the setup first')
      && flagged === 1 && labels.length === 5 && labels.filter((l) => /^5\d\.\d\/5\d\.\d Gb\/s/.test(l)).length === 4
      && labels.some((l) => l.startsWith('11.6/54.9 Gb/s')) && status.includes('4 ok, 1 flagged, 0 failed')
      && legend.includes('check failed');
    record('check_cables_button', ok, `before=${before} tip=${tip} flagged=${flagged} labels=${labels} status=${status}`);
  });

  await step('panel_renders', async () => {
    await page.locator('.jp-SideBar .lm-TabBar-tab[data-id="mlx-jupyter-cluster-panel"]').click();
    await page.locator('#mlx-jupyter-cluster-panel .mlxj-empty').waitFor({ timeout: 20000 });
    await page.locator('#mlx-jupyter-cluster-panel button.mlxj-start').waitFor({ timeout: 20000 });
    await page.screenshot({ path: shot('panel-empty.png') });
    const panel = page.locator('#mlx-jupyter-cluster-panel');
    const what = await panel.locator('.mlxj-panel-what').innerText();
    const empty = await panel.locator('.mlxj-empty').innerText();
    const labels = await panel.locator('.mlxj-field label.mlxj-label').allInnerTexts();
    record('panel_renders', /MLX clusters: started here or with %mlx_cluster/.test(what) && /IPython Parallel/.test(what)
      && /%mlx_cluster start/.test(empty)
      && JSON.stringify(labels) === JSON.stringify(['ranks per host', 'hosts', 'hostfile', 'backend']),
      `what=${what} empty=${empty} labels=${labels}`);
  });

  await step('panel_form_validation', async () => {
    // the form is the server's schema: a value out of its range is named under its field before anything is
    // sent; a host name the server refuses is named under the hosts field with the server's words
    const panel = page.locator('#mlx-jupyter-cluster-panel');
    const msg = (f) => panel.locator(`.mlxj-field[data-field="${f}"] .mlxj-field-msg`);
    await panel.locator('input.mlxj-n').fill('99');
    await panel.locator('button.mlxj-start').click();
    await page.waitForFunction(() => /an integer from 1 to 64/.test(document.querySelector(
      '#mlx-jupyter-cluster-panel .mlxj-field[data-field="n"] .mlxj-field-msg')?.textContent || ''), null, { timeout: 5000 });
    const nSays = await msg('n').innerText();
    const invalid = await panel.locator('input.mlxj-n').getAttribute('aria-invalid');
    await page.screenshot({ path: shot('panel-form-invalid.png') });
    await panel.locator('input.mlxj-n').fill('2');
    await panel.locator('input.mlxj-hosts-input').fill('bad host!');
    await panel.locator('button.mlxj-start').click();
    await page.waitForFunction(() => /not a host name/.test(document.querySelector(
      '#mlx-jupyter-cluster-panel .mlxj-field[data-field="hosts"] .mlxj-field-msg')?.textContent || ''), null, { timeout: 10000 });
    const hostsSays = await msg('hosts').innerText();
    // hosts and a hostfile together: refused under the hostfile field, in the server's words (form_fields)
    await panel.locator('input.mlxj-hosts-input').fill('a,b');
    await panel.locator('input.mlxj-hostfile-input').fill('/nowhere/hostfile.json');
    await panel.locator('button.mlxj-start').click();
    await page.waitForFunction(() => /not both/.test(document.querySelector(
      '#mlx-jupyter-cluster-panel .mlxj-field[data-field="hostfile"] .mlxj-field-msg')?.textContent || ''), null, { timeout: 5000 });
    const bothSays = await msg('hostfile').innerText();
    await panel.locator('input.mlxj-hostfile-input').fill('');
    await panel.locator('input.mlxj-hosts-input').fill('');
    const cleared = await msg('n').innerText();
    const cards = await panel.locator('.mlxj-card').count();
    record('panel_form_validation', nSays === 'ranks per host: an integer from 1 to 64' && invalid === 'true'
      && /^hosts: entry 1 is not a host name/.test(hostsSays) && cleared === '' && cards === 0
      && bothSays === 'give hosts or a hostfile, not both (the hostfile lists the hosts)',
      `n: ${nSays} (aria-invalid ${invalid}); hosts: ${hostsSays}; both: ${bothSays}; cards=${cards}`);
  });

  let panelPids = [];
  await step('panel_start', async () => {
    const panel = page.locator('#mlx-jupyter-cluster-panel');
    await panel.locator('input.mlxj-n').fill('2');
    await panel.locator('button.mlxj-start').click();
    await panel.locator('.mlxj-card .mlxj-pill-running').waitFor({ timeout: 60000 });
    await page.waitForFunction(() => document.querySelectorAll('#mlx-jupyter-cluster-panel .mlxj-ranks tr.mlxj-health-ok').length === 2,
                               null, { timeout: 30000 });
    // the "starting" message follows the card once it is running
    await page.waitForFunction(() => /running: 2 of 2 ranks ok/.test(
      document.querySelector('#mlx-jupyter-cluster-panel .mlxj-panel-message').textContent), null, { timeout: 10000 });
    await page.screenshot({ path: shot('panel-running.png') });
    const rows = await rankRows('#mlx-jupyter-cluster-panel .mlxj-ranks tr[data-pid]');
    panelPids = rows.map((r) => r.pid);
    const layout = await panelLayout();
    const health = await panel.locator('.mlxj-card-health').innerText();
    const ok = rows.length === 2 && panelPids.every((p) => p > 0 && alive(p)) && rows.every((r) => r.health === 'ok'
      && /^\d+(\.\d+)? [KMG]?i?B$/.test(r.memory)) && layout.length === 0 && health.includes('2 of 2 ranks ok');
    record('panel_start', ok, `rows=${JSON.stringify(rows)} health=${health} layout=${layout}`);
  });

  let inserted = -1;
  await step('panel_insert_code', async () => {
    const panel = page.locator('#mlx-jupyter-cluster-panel');
    await page.locator('.jp-Notebook .jp-Cell').first().click();
    await panel.locator('button.mlxj-insert').click();
    await page.waitForFunction(() => [...document.querySelectorAll('.jp-Notebook .jp-Cell .cm-content')]
      .some((c) => c.textContent.includes('%mlx_cluster connect mlx-')), null, { timeout: 10000 });
    inserted = await page.evaluate(() => window.jupyterapp.shell.currentWidget.content.activeCellIndex);
  });

  await step('panel_connect_cell_runs', async () => {
    // the inserted cell connects this notebook's kernel to the panel's cluster
    await runCell(inserted);
    await page.waitForFunction((i) => {
      const cell = window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-Cell')[i];
      return cell && /connected to mlx-|Error/.test(cell.querySelector('.jp-OutputArea')?.textContent || '');
    }, inserted, { timeout: 60000 });
    const out = page.locator('.jp-Notebook .jp-Cell').nth(inserted).locator('.jp-OutputArea-output');
    const text = (await out.allInnerTexts()).join('\n');
    record('panel_connect_cell_runs', /connected to mlx-\w+: 2 ranks/.test(text), text.slice(0, 500));
  });

  await step('panel_cluster_runs_distributed_cell', async () => {
    // a %%mlx_distributed cell below it runs MLX's all_sum on both of the panel's ranks
    const code = '%%mlx_distributed\nx = mx.distributed.all_sum(mx.array([world.rank() + 1.0]), group=world)\n'
      + 'print(f"rank {world.rank()}: all_sum = {x.item():g}")';
    const index = await insertCellBelow(code);
    await runCell(index);
    await page.waitForFunction((i) => {
      const cell = window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-Cell')[i];
      const t = cell?.querySelector('.jp-OutputArea')?.textContent || '';
      return /rank 1: all_sum/.test(t) && /rank 0: all_sum/.test(t) || /Error/.test(t);
    }, index, { timeout: 60000 });
    const out = page.locator('.jp-Notebook .jp-Cell').nth(index).locator('.jp-OutputArea-output');
    const text = (await out.allInnerTexts()).join('\n');
    await page.screenshot({ path: shot('panel-cluster-cell.png') });
    record('panel_cluster_runs_distributed_cell',
      text.includes('rank 0: all_sum = 3') && text.includes('rank 1: all_sum = 3'), text.slice(0, 500));
  });

  await step('live_where_table', async () => {
    // a cell on the panel's cluster in which rank 1 sleeps before the all_sum rank 0 is already in: the
    // table of where the ranks are shows under the cell while it runs (and the panel shows the same states;
    // its headline once rank 0 has waited 2 s: 6 s of sleep leave it two of the panel's looks, every 2 s)
    const code = '%%mlx_distributed\nimport time\nif world.rank() == 1:\n    time.sleep(6)\n'
      + 'mx.eval(mx.distributed.all_sum(mx.ones(2), group=world))';
    const index = await insertCellBelow(code);
    runCell(index).catch((e) => logs.push(`run-cell: ${e}`));
    await page.waitForFunction((i) => {
      const cell = window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-Cell')[i];
      return /waits in MLX all_sum #1 \(float32\[2\], built at line 5, evaluated at line 5\) on rank 1/.test(cell?.querySelector('.mlxj-where-diagnosis')?.textContent || '');
    }, index, { timeout: 30000 });
    const table = page.locator('.jp-Notebook .jp-Cell').nth(index).locator('.jp-OutputArea-output');
    const text = (await table.allInnerTexts()).join('\n');
    await table.last().scrollIntoViewIfNeeded();
    await page.screenshot({ path: shot('live-where-table.png') });
    // the panel, refreshed meanwhile, says the same of its cluster (its first look may come before the
    // ranks' MLX record shows the wait, when it names the stack's frame instead: wait for the record's words)
    const panelText = () => document.querySelector('#mlx-jupyter-cluster-panel .mlxj-card-diagnosis')?.textContent || '';
    const panelSays = await page.waitForFunction(() => {
      const t = document.querySelector('#mlx-jupyter-cluster-panel .mlxj-card-diagnosis')?.textContent || '';
      return /waits in MLX all_sum #1 .*on rank 1/.test(t) ? t : '';
    }, null, { timeout: 10000 }).then((h) => h.jsonValue()).catch(() => page.evaluate(panelText));
    await page.screenshot({ path: shot('panel-where.png') });
    await page.waitForFunction((i) => {
      const cell = window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-Cell')[i];
      return /the cell ran \d+\.\d s: ranks 0 and 1 done/.test(cell?.querySelector('.jp-OutputArea')?.textContent || '');
    }, index, { timeout: 30000 });
    // MLX's own collective on world, named (issue 32): which call, where it was built and evaluated, on whom
    record('live_where_table', /waits in MLX all_sum #1 \(float32\[2\], built at line 5, evaluated at line 5\) on rank 1/.test(text)
      && /has called 0 MLX collectives and is at line 4: time\.sleep\(6\)/.test(text)
      && /waits in MLX all_sum #1 .*on rank 1/.test(panelSays),
      `${text.slice(0, 600)} | panel: ${panelSays}`);
  });

  await step('dashboard_live', async () => {
    // the panel card's Dashboard opens a tab on the cluster: its ranks with host, pid and memory, refreshed every
    // second; a cell hanging on rank 1 shows rank 0 waiting on it within 2 s of the cell's start
    const panel = page.locator('#mlx-jupyter-cluster-panel');
    await page.evaluate(() => { window.mlxjNotebook = window.jupyterapp.shell.currentWidget; });
    const code = '%%mlx_distributed\nimport time\nif world.rank() == 1:\n    time.sleep(5)\n'
      + 'mx.eval(mx.distributed.all_sum(mx.ones(2), group=world))';
    const index = await insertCellBelow(code);
    await panel.locator('button.mlxj-open-dashboard').first().click();
    const dash = page.locator('.mlxj-dashboard');
    await dash.locator('.mlxj-dash-ranks tr[data-rank]').nth(1).waitFor({ timeout: 10000 });
    const rows = await dash.locator('.mlxj-dash-ranks tr[data-rank]').evaluateAll((trs) => trs.map((tr) => ({
      rank: tr.dataset.rank,
      pid: Number(tr.querySelector('.mlxj-dash-pid').textContent),
      memory: tr.querySelector('.mlxj-dash-memory .mlxj-dash-value').textContent })));
    const stamp = await dash.locator('.mlxj-dash-updated').innerText();
    await page.waitForFunction((s) => document.querySelector('.mlxj-dashboard .mlxj-dash-updated')?.textContent !== s,
                               stamp, { timeout: 3000 });  // refreshed at least once a second (and a bit)
    // the dashboard opened beside the notebook: both stay visible with the notebook active again
    await page.evaluate(() => window.jupyterapp.shell.activateById(window.mlxjNotebook.id));
    const beside = await dash.isVisible();
    const t0 = Date.now();
    runCell(index).catch((e) => logs.push(`run-cell: ${e}`));
    const waiting = await page.waitForFunction(() => /waits in MLX all_sum #1 .*on rank 1/.test(
      document.querySelector('.mlxj-dashboard .mlxj-dash-ranks tr[data-rank="0"] .mlxj-dash-state')?.textContent || ''),
      null, { timeout: 10000 }).then(() => Date.now() - t0).catch(() => -1);
    const state0 = await dash.locator('tr[data-rank="0"] .mlxj-dash-state').innerText();
    await page.screenshot({ path: shot('dashboard-waiting.png') });
    await page.waitForFunction((i) => {
      const cell = window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-Cell')[i];
      return /ranks 0 and 1 done|Error/.test(cell?.querySelector('.jp-OutputArea')?.textContent || '');
    }, index, { timeout: 30000 });
    const pidsMatch = rows.length === 2 && rows.every((r) => panelPids.includes(r.pid));
    const ok = pidsMatch && rows.every((r) => /^\d+(\.\d+)? [KMG]?i?B$/.test(r.memory)) && waiting >= 0 && waiting <= 2000 && beside;
    // the tab closed again: the steps below work on the notebook alone
    await page.evaluate(() => document.querySelector('.mlxj-dashboard') && [...window.jupyterapp.shell.widgets('main')]
      .filter((w) => w.hasClass('mlxj-dashboard')).forEach((w) => w.close()));
    record('dashboard_live', ok, `beside=${beside} rows=${JSON.stringify(rows)} panel pids=${panelPids} waiting shown after ${waiting} ms: ${state0}`);
  });

  await step('profile_timeline', async () => {
    // a profiled cell on the panel's cluster: under it, the timeline picture with one lane per rank (SVG,
    // which JupyterLab shows as an image) and the text summary
    const code = '%%mlx_distributed --profile\nimport numpy as np\nfrom mlx_jupyter import distributed as dist\n'
      + 'for i in range(20):\n    dist.all_sum(np.ones(4096), group=group)';
    const index = await insertCellBelow(code);
    runCell(index).catch((e) => logs.push(`run-cell: ${e}`));
    const found = await page.waitForFunction((i) => {
      const cell = window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-Cell')[i];
      const img = cell?.querySelector('.jp-RenderedSVG img');
      if (img && img.complete && img.naturalWidth > 0) return decodeURIComponent(img.src.slice(img.src.indexOf(',') + 1));
      return /Error|no profile/.test(cell?.querySelector('.jp-OutputArea')?.textContent || '') ? 'ERROR' : false;
    }, index, { timeout: 60000 });
    const svg = await found.jsonValue();
    await kernelIdle();
    const lanes = svg.match(/>rank \d+<\/text>/g) || [];
    const bars = (svg.match(/<title>all_sum/g) || []).length + (svg.match(/<title>\d+ ops \(all_sum/g) || []).length;
    const picture = page.locator('.jp-Notebook .jp-Cell').nth(index).locator('.jp-RenderedSVG').first();
    await picture.scrollIntoViewIfNeeded();
    await picture.screenshot({ path: shot('profile-timeline.png') });
    const text = (await page.locator('.jp-Notebook .jp-Cell').nth(index).locator('.jp-OutputArea-output')
      .allInnerTexts()).join('\n');
    record('profile_timeline', JSON.stringify(lanes) === JSON.stringify(['>rank 0</text>', '>rank 1</text>'])
      && bars >= 2 && /op records on 2 ranks/.test(text) && /straggler:/.test(text),
      `lanes=${lanes} bars=${bars} text=${text.slice(0, 300)}`);
  });

  await step('dashboard_charts_and_profile', async () => {
    // the dashboard again, while a cell runs our core's collectives on both ranks: CPU and memory charts per
    // rank, collectives/s and bytes/s above 0, and the profile recorded by the step above, in both themes
    const panel = page.locator('#mlx-jupyter-cluster-panel');
    const code = '%%mlx_distributed\nimport time, numpy as np\nfrom mlx_jupyter import distributed as dist\n'
      + 'for i in range(300):\n'   // as many on each rank (a loop by time would leave one rank in a last all_sum)
      + '    dist.all_sum(np.ones(16384), group=group)\n    time.sleep(0.01)';
    const index = await insertCellBelow(code);
    await panel.locator('button.mlxj-open-dashboard').first().click();
    const dash = page.locator('.mlxj-dashboard');
    await dash.locator('.mlxj-dash-ranks tr[data-rank]').nth(1).waitFor({ timeout: 10000 });
    await page.evaluate(() => window.jupyterapp.shell.activateById(window.mlxjNotebook.id));  // the cell runs there
    const began = Date.now() / 1000;
    runCell(index).catch((e) => logs.push(`run-cell: ${e}`));
    // each chart (one per measure, a line per rank: chartpanel.ts) says its figures per rank in data attributes
    const peaks = () => page.evaluate(() => [0, 1].map((r) =>
      Object.fromEntries(['cpu', 'memory', 'ops', 'bytes'].map((k) => {
        const box = document.querySelector(`.mlxj-dashboard .mlxj-dash-chart-${k}`);
        return [k, { points: Number(box?.dataset[`points${r}`] || 0), peak: Number(box?.dataset[`peak${r}`] || 0),
                     lines: box?.querySelectorAll('canvas').length || 0 }];
      }))));
    // the loop's own ops: a point after the cell began with ops above 0, on both ranks (the server's clock is this one's)
    await page.waitForFunction((t0) => [0, 1].every((r) => {
      const chart = (k) => document.querySelector(`.mlxj-dashboard .mlxj-dash-chart-${k}`)?.dataset || {};
      return Number(chart('ops')[`last${r}`] || 0) > 0 && Number(chart('ops').newest || 0) > t0
        && Number(chart('cpu')[`points${r}`] || 0) >= 3;
    }), began, { timeout: 20000 });
    const charts = await peaks();
    const profile = await dash.locator('.mlxj-dash-profile').evaluate((box) => ({
      head: box.querySelector('h3')?.textContent || '', img: !!box.querySelector('img.mlxj-dash-profile-img')?.naturalWidth,
      summary: box.querySelector('.mlxj-dash-profile-summary')?.textContent || '' }));
    await page.screenshot({ path: shot('dashboard-charts.png') });
    await dash.screenshot({ path: shot('dashboard-charts-tab.png') });
    const look = () => page.evaluate(() => {
      const d = document.querySelector('.mlxj-dashboard');
      const card = d.querySelector('.mlxj-dash-chart-cpu');
      return { light: document.body.dataset.jpThemeLight, background: getComputedStyle(d).backgroundColor,
               text: getComputedStyle(d).color, stroke: card ? getComputedStyle(card).borderTopColor : '' };
    });
    const light = await look();
    await run('apputils:change-theme', { theme: 'JupyterLab Dark' });
    await page.waitForFunction(() => document.body.dataset.jpThemeLight === 'false', null, { timeout: 20000 });
    await page.waitForFunction((bg) => getComputedStyle(document.querySelector('.mlxj-dashboard')).backgroundColor !== bg,
                               light.background, { timeout: 10000 });
    const dark = await look();
    await page.screenshot({ path: shot('dashboard-charts-dark.png') });
    await dash.screenshot({ path: shot('dashboard-charts-tab-dark.png') });
    await panel.screenshot({ path: shot('panel-dark.png') });
    // JupyterLab's high-contrast theme: the same variables, so the same code; kept as pictures. Its background
    // is dark's (a wait for another one ran out its 10 s): wait for the theme to be applied, then for its text
    await run('apputils:change-theme', { theme: 'JupyterLab Dark High Contrast' });
    await page.waitForFunction(() => document.body.dataset.jpThemeName === 'JupyterLab Dark High Contrast', null,
                               { timeout: 20000 });
    await page.waitForFunction((d) => {
      const s = getComputedStyle(document.querySelector('.mlxj-dashboard'));
      return s.backgroundColor !== d.background || s.color !== d.text;
    }, dark, { timeout: 10000 }).catch(() => {});
    const contrast = await look();
    await dash.screenshot({ path: shot('dashboard-charts-tab-high-contrast.png') });
    await panel.screenshot({ path: shot('panel-high-contrast.png') });
    await run('apputils:change-theme', { theme: 'JupyterLab Light' });
    await page.waitForFunction(() => document.body.dataset.jpThemeLight === 'true', null, { timeout: 20000 });
    await kernelIdle();   // a healthy loop shows no table and no closing line
    await page.evaluate(() => [...window.jupyterapp.shell.widgets('main')]
      .filter((w) => w.hasClass('mlxj-dashboard')).forEach((w) => w.close()));
    const drawn = charts.every((r) => ['cpu', 'memory', 'ops', 'bytes'].every((k) => r[k].lines >= 1))
      && charts.every((r) => r.ops.peak > 0 && r.bytes.peak >= r.ops.peak * 32768 * 0.99 && r.memory.peak > 0);
    const themed = light.light === 'true' && dark.light === 'false' && light.background !== dark.background
      && light.text !== dark.text && !!light.stroke && light.stroke !== 'none' && !!dark.stroke;
    const shown = /^Last profile: .*ranks 0, 1$/.test(profile.head) && profile.img && /op records on 2 ranks/.test(profile.summary);
    record('dashboard_charts_and_profile', drawn && themed && shown,
      `charts=${JSON.stringify(charts)} light=${JSON.stringify(light)} dark=${JSON.stringify(dark)} high contrast=${JSON.stringify(contrast)} profile=${JSON.stringify(profile).slice(0, 300)}`);
  });

  await step('panel_restart', async () => {
    // the panel's Restart: fresh ranks, the connected notebook's `x` still there, MLX's world works
    const panel = page.locator('#mlx-jupyter-cluster-panel');
    await panel.locator('button.mlxj-restart').click();
    await panel.locator('button.mlxj-confirm').click();  // the card asks first
    await page.waitForFunction(() => /restarted|restart failed/.test(
      document.querySelector('#mlx-jupyter-cluster-panel .mlxj-panel-message').textContent), null, { timeout: 90000 });
    const message = await panel.locator('.mlxj-panel-message').innerText();
    await page.waitForFunction((old) => {
      const ok = [...document.querySelectorAll('#mlx-jupyter-cluster-panel .mlxj-ranks tr.mlxj-health-ok')];
      return ok.length === 2 && ok.every((r) => !old.includes(Number(r.dataset.pid)));
    }, panelPids, { timeout: 30000 }).catch(() => {});   // the check below names what it saw
    const rows = await rankRows('#mlx-jupyter-cluster-panel .mlxj-ranks tr[data-pid]');
    const fresh = rows.map((r) => r.pid);
    await page.locator('#mlx-jupyter-cluster-panel .mlxj-card-restart').waitFor({ timeout: 10000 });
    // where each rank's names came from: its row's tooltip (the dashboard has the column)
    const origins = await page.locator('#mlx-jupyter-cluster-panel .mlxj-ranks tr[data-pid]').evaluateAll((trs) => trs.map((tr) => tr.dataset.restart));
    const restartLine = await page.locator('#mlx-jupyter-cluster-panel .mlxj-card-restart').innerText();
    await page.screenshot({ path: shot('panel-restarted.png') });
    const code = '%%mlx_distributed\ny = mx.distributed.all_sum(mx.array([world.rank() + 1.0]), group=world)\n'
      + 'print(f"rank {world.rank()}: kept x = {x.item():g}, new all_sum = {y.item():g}")';
    const index = await insertCellBelow(code);
    await runCell(index);
    await page.waitForFunction((i) => {
      const cell = window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-Cell')[i];
      const t = cell?.querySelector('.jp-OutputArea')?.textContent || '';
      return /rank 1: kept/.test(t) && /rank 0: kept/.test(t) || /Error/.test(t);
    }, index, { timeout: 60000 });
    const text = (await page.locator('.jp-Notebook .jp-Cell').nth(index).locator('.jp-OutputArea-output')
      .allInnerTexts()).join('\n');
    const ok = /restarted/.test(message) && !/kept/.test(message) && /kept \d+ names? on 2 ranks/.test(restartLine) && fresh.length === 2
      && fresh.every((p) => p > 0 && !panelPids.includes(p)) && panelPids.every((p) => !alive(p))
      && text.includes('rank 0: kept x = 3, new all_sum = 3') && text.includes('rank 1: kept x = 3, new all_sum = 3')
      && JSON.stringify(origins) === JSON.stringify(['its own names', 'its own names']) && /^last restart: kept/.test(restartLine);
    const old = panelPids;
    panelPids = fresh;
    record('panel_restart', ok, `message=${message} origins=${origins} line=${restartLine} pids ${old} -> ${fresh} text=${text.slice(0, 400)}`);
  });

  await step('panel_stop', async () => {
    const panel = page.locator('#mlx-jupyter-cluster-panel');
    await panel.locator('button.mlxj-stop').click();
    await panel.locator('.mlxj-confirm-box').waitFor({ timeout: 5000 });
    await page.screenshot({ path: shot('panel-confirm-stop.png') });
    await panel.locator('button.mlxj-confirm').click();  // the card asks first
    await panel.locator('.mlxj-empty').waitFor({ timeout: 30000 });
    await page.screenshot({ path: shot('panel-stopped.png') });
    if (panelPids.length !== 2) throw new Error(`no rank pids recorded at panel_start: ${panelPids}`);
    await waitGone(panelPids, 20000);
    return `ranks ${panelPids} gone`;
  });

  // A start that fails (mpi as root: Open MPI's refusal, a long message): a failed card with its error
  // wrapped and collapsed behind "more", no "Use in notebook", and Dismiss removes it.
  await step('panel_failed_card', async () => {
    if (process.getuid?.() !== 0) return 'skipped: not root (mpi starts as an ordinary user)';
    const panel = page.locator('#mlx-jupyter-cluster-panel');
    await panel.locator('select.mlxj-backend').selectOption('mpi');
    await panel.locator('button.mlxj-start').click();
    const card = panel.locator('.mlxj-card.mlxj-card-failed');
    await card.waitFor({ timeout: 60000 });
    await panel.locator('select.mlxj-backend').selectOption('');
    const collapsed = await card.locator('details.mlxj-error-long').count();
    const insert = await card.locator('button.mlxj-insert').count();
    const dismiss = await card.locator('button.mlxj-dismiss').count();
    const layoutClosed = await panelLayout();
    await page.screenshot({ path: shot('panel-failed.png') });
    await card.locator('details.mlxj-error-long summary').click();
    const full = await card.locator('.mlxj-error-full').innerText();
    const layoutOpen = await panelLayout();
    await page.screenshot({ path: shot('panel-failed-more.png') });
    await card.locator('button.mlxj-dismiss').click();
    await card.waitFor({ state: 'detached', timeout: 20000 });
    const message = await panel.locator('.mlxj-panel-message').innerText();
    const ok = collapsed === 1 && insert === 0 && dismiss === 1 && layoutClosed.length === 0 && layoutOpen.length === 0
      && /refuses to run as root/.test(full) && /hostfile/.test(full) && /removed/.test(message);
    record('panel_failed_card', ok, `collapsed=${collapsed} insert=${insert} dismiss=${dismiss} `
      + `layout=${layoutClosed}|${layoutOpen} message=${message} error=${full.slice(0, 120)}`);
  });

  // A kernel's own cluster: the quickstart's status widget, and the panel listing it.
  let widgetPids = [];
  await step('status_widget_renders', async () => {
    await run('docmanager:open', { path: 'status.ipynb' });
    await page.waitForFunction(() => window.jupyterapp.shell.currentWidget?.context?.path === 'status.ipynb',
                               null, { timeout: 30000 });
    await page.evaluate(() => window.jupyterapp.shell.currentWidget.sessionContext.ready);
    await kernelIdle();
    runAbove(2).catch((e) => logs.push(`run-all-above: ${e}`));
    await page.waitForFunction(() => {
      const rows = document.querySelectorAll('.mlxj-status-widget table tr.mlxj-state-idle');
      return rows.length === 2;
    }, null, { timeout: 90000 });
    const widget = page.locator('.mlxj-status-widget');
    await widget.scrollIntoViewIfNeeded();
    const head = await widget.locator('.mlxj-status-head').innerText();
    const rows = await widget.locator('table tr').evaluateAll((trs) => trs.slice(1).map((tr) =>
      [...tr.querySelectorAll('td')].map((td) => td.textContent)));
    widgetPids = rows.map((r) => Number(r[2]));
    await page.screenshot({ path: shot('status-widget.png') });
    const ok = /MLX cluster mlx-\S+ — 2 ranks · ring/.test(head) && rows.length === 2
      && rows.every((r, i) => r[0] === String(i) && r[1] === '127.0.0.1' && /^\d+$/.test(r[2]) && r[3] === 'idle'
                    && r[4] === '' && /^\d+\.\d MiB$/.test(r[5]))
      && widgetPids.every(alive);
    record('status_widget_renders', ok, `${head} rows=${JSON.stringify(rows)}`);
  });

  await step('panel_lists_kernel_cluster', async () => {
    const card = page.locator('#mlx-jupyter-cluster-panel .mlxj-card', { hasText: 'kernel pid' });
    await card.waitFor({ timeout: 20000 });
    await page.waitForFunction(() => [...document.querySelectorAll(
      '#mlx-jupyter-cluster-panel .mlxj-card .mlxj-ranks tr.mlxj-health-ok .mlxj-col-state')].filter((td) => td.textContent === 'idle')
      .length === 2, null, { timeout: 20000 });
    const rows = await rankRows('#mlx-jupyter-cluster-panel .mlxj-card .mlxj-ranks tr[data-pid]');
    const stop = await card.locator('button.mlxj-stop').count();
    const owner = await card.locator('.mlxj-card-owner').innerText();
    const health = await card.locator('.mlxj-card-health').innerText();
    const layout = await panelLayout();
    await page.screenshot({ path: shot('panel-kernel-cluster.png') });
    const pids = rows.map((r) => r.pid).sort();
    // health is whether the rank lives (ok); what it does is its state, in words: idle, not "running"
    const ok = JSON.stringify(pids) === JSON.stringify([...widgetPids].sort()) && stop === 0 && layout.length === 0
      && rows.every((r) => r.health === 'ok' && r.state === 'idle') && /^started by status\.ipynb \(kernel pid \d+\)$/.test(owner)
      && health === '2 of 2 ranks ok, idle';
    record('panel_lists_kernel_cluster', ok, `rows=${JSON.stringify(rows)} owner=${owner} health=${health} stop buttons=${stop} layout=${layout}`);
  });

  // A cluster another process of the user published (this node process stands for it: alive, no kernel of
  // this server): listed apart, behind a toggle, labelled with its pid; the kernel's card stays in the list
  await step('panel_other_processes', async () => {
    const folder = path.join(path.dirname(resultsFile), 'runtime', 'mlx-jupyter', 'clusters');
    const file = path.join(folder, 'mlx-elsewhere.json');
    fs.writeFileSync(file, JSON.stringify({ id: 'mlx-elsewhere', owner: 'kernel', owner_pid: process.pid, backend: 'ring',
      hosts: ['127.0.0.1'], size: 2, busy: [], ranks: [] }));
    try {
      const panel = page.locator('#mlx-jupyter-cluster-panel');
      const toggle = panel.locator('button.mlxj-others-toggle');
      await toggle.waitFor({ timeout: 20000 });
      const closed = await toggle.innerText();
      const hidden = await panel.locator('.mlxj-card[data-cluster="mlx-elsewhere"]').count();
      await toggle.click();
      const card = panel.locator('.mlxj-others .mlxj-card[data-cluster="mlx-elsewhere"]');
      await card.waitFor({ timeout: 10000 });
      const owner = await card.locator('.mlxj-card-owner').innerText();
      const ownList = await panel.locator('.mlxj-panel-list > .mlxj-card').count();
      await page.screenshot({ path: shot('panel-other-processes.png') });
      await panel.locator('button.mlxj-others-toggle').click();
      await card.waitFor({ state: 'detached', timeout: 10000 });
      record('panel_other_processes', closed === "▸ Other processes' clusters (1)" && hidden === 0 && ownList === 1
        && owner === `another process's cluster (pid ${process.pid})`, `toggle=${closed} hidden=${hidden} owner=${owner} own=${ownList}`);
    } finally {
      fs.rmSync(file, { force: true });
    }
  });

  await step('status_widget_busy_clock', async () => {
    // cell 2 runs on both ranks until the release file exists: the widget shows them busy, with a ticking clock
    runCell(2).catch((e) => logs.push(`run-cell: ${e}`));
    await page.waitForFunction(() => {
      const rows = [...document.querySelectorAll('.mlxj-status-widget table tr.mlxj-state-busy')];
      return rows.length === 2 && rows.every((tr) => /^[1-9]\d* s$/.test(tr.querySelector('.mlxj-clock').textContent));
    }, null, { timeout: 30000 });
    await page.locator('.mlxj-status-widget').scrollIntoViewIfNeeded();
    // the panel shows the kernel's ranks running while the cell runs (idle again after: progress_bars_live)
    await page.waitForFunction(() => [...document.querySelectorAll(
      '#mlx-jupyter-cluster-panel .mlxj-card .mlxj-ranks tr.mlxj-health-ok .mlxj-col-state')]
      .filter((td) => td.textContent === 'running a cell').length === 2, null, { timeout: 20000 });
    await page.screenshot({ path: shot('status-widget-busy.png') });
    const clocks = await page.locator('.mlxj-status-widget .mlxj-clock').allInnerTexts();
    fs.writeFileSync(releaseFlag, 'go');
    await page.waitForFunction(() => document.querySelectorAll('.mlxj-status-widget table tr.mlxj-state-idle').length === 2,
                               null, { timeout: 30000 });
    return `clocks while busy: ${clocks}`;
  });

  // cell i of the current notebook in view (other notebooks' cells are in the DOM too, hidden)
  const showCell = (i) => page.evaluate((k) => window.jupyterapp.shell.currentWidget.node
    .querySelectorAll('.jp-Cell')[k].scrollIntoView({ block: 'center' }), i);
  // Progress bars on ranks (cell 3): tqdm.auto's text bar per rank, in one display updated in place
  const progressText = () => page.evaluate(() => window.jupyterapp.shell.currentWidget.node
    .querySelectorAll('.jp-Cell')[3]?.querySelector('.jp-OutputArea')?.textContent || '');
  await step('progress_bars_live', async () => {
    await kernelIdle();
    runCell(3).catch((e) => logs.push(`run-cell: ${e}`));
    await page.waitForFunction(() => {
      const text = window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-Cell')[3]
        ?.querySelector('.jp-OutputArea')?.textContent || '';
      return /\[rank 0\] train:  30%/.test(text) && /\[rank 1\] train:  40%/.test(text);
    }, null, { timeout: 30000 });
    await showCell(3);
    await page.screenshot({ path: shot('progress-bars.png') });
    const text = await progressText();
    const rows = (text.match(/\[rank [01]\] train:/g) || []).length;
    const ok = rows === 2 && !/model not found|Error displaying widget/.test(text);
    record('progress_bars_live', ok, `rows=${rows} text=${text.slice(0, 300)}`);
  });
  await step('progress_bars_final', async () => {
    fs.writeFileSync(`${releaseFlag}.progress`, 'go');
    await page.waitForFunction(() => {
      const text = window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-Cell')[3]
        ?.querySelector('.jp-OutputArea')?.textContent || '';
      return /\[ranks 0-1\] step 2/.test(text);
    }, null, { timeout: 30000 });
    await kernelIdle();
    await showCell(3);
    await page.screenshot({ path: shot('progress-bars-done.png') });
    const text = await progressText();
    // each rank's bar ends at 10/10 (one row for both when their final lines match, rates included);
    // the live rows (30%, 40%) are gone
    const done = /\[ranks 0-1\] train: 100%\|##########\| 10\/10/.test(text)
      || [0, 1].every((r) => new RegExp(`\\[rank ${r}\\] train: 100%\\|##########\\| 10/10`).test(text));
    // a finished bar is a success's output: on stdout, not on stderr's (red) background (issue 30 §4.4)
    const kinds = await page.evaluate(() => [...window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-Cell')[3]
      .querySelectorAll('.jp-OutputArea-output')].filter((o) => /train: 100%/.test(o.textContent))
      .map((o) => o.getAttribute('data-mime-type')));
    const onStdout = kinds.length > 0 && kinds.every((k) => k === 'application/vnd.jupyter.stdout');
    const ok = done && onStdout && !/train:\s+[1-9]0%/.test(text)
      && !/model not found|Error displaying widget/.test(text) && !text.includes('\r');
    record('progress_bars_final', ok, `final bar in ${kinds}: ${text.slice(0, 400)}`);
  });

  await step('status_cluster_stop', async () => {
    await kernelIdle();
    runCell(4).catch((e) => logs.push(`run-cell: ${e}`));
    await page.waitForFunction(() => {
      const cells = window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-Cell');
      return /cluster stopped/.test(cells[4]?.querySelector('.jp-OutputArea')?.textContent || '');
    }, null, { timeout: 30000 });
    if (widgetPids.length !== 2) throw new Error(`no rank pids read from the widget: ${widgetPids}`);
    await waitGone(widgetPids, 20000);
    await page.locator('#mlx-jupyter-cluster-panel .mlxj-empty').waitFor({ timeout: 20000 });
    return `ranks ${widgetPids} gone, panel empty`;
  });
} finally {
  const errors = logs.filter((l) => !BENIGN.some((re) => re.test(l)));
  record('console_errors', errors.length === 0, errors.slice(0, 20).join(' | ') || `none (${logs.length} benign)`);
  await finish();
}
