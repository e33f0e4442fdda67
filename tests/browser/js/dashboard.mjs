// Drives JupyterLab in headless chromium through issue 45's dashboard: a kernel's cluster (%mlx_cluster start) gets
// the same live charts as the panel's, with MLX's memory; a healthy loop raises no alarm, a rank that stalls does;
// the charts have time axes, values on hover and a choice of window; a second dashboard opens as a tab; the card's
// layout (buttons, columns, a start, a confirmation that stays); the --profile timeline readable in the dark theme.
// Usage: node dashboard.mjs <lab url> <token> <screenshot dir> <results.json>
// Each check lands in results.json ({name: {ok, detail}}); pytest asserts on them.
import fs from 'node:fs';
import path from 'node:path';
import { base, browser, cellText, finish, kernelIdle, logs, openNotebook, page, pin, record, resultsFile, run, runCell,
  runToEnd, shot, start, step, token } from './scenario.mjs';

await start({ viewport: { width: 1500, height: 1000 }, prefix: 'failed-dash-' });
const panel = page.locator('#mlx-jupyter-cluster-panel');
const dash = page.locator('.mlxj-dashboard').first();

async function themeTo(p, name, light) {
  await p.evaluate((n) => window.jupyterapp.commands.execute('apputils:change-theme', { theme: n }), name);
  await p.waitForFunction((l) => document.body.dataset.jpThemeLight === l, light, { timeout: 20000 });
}

// a chart's figures per rank, as the chart says them (chartpanel.ts)
const chart = (key) => page.evaluate((k) => {
  const box = document.querySelector(`.mlxj-dashboard .mlxj-dash-chart-${k}`);
  if (!box) return null;
  return { canvas: !!box.querySelector('canvas'), newest: Number(box.dataset.newest || 0),
           ranks: [0, 1].map((r) => ({ points: Number(box.dataset[`points${r}`] || 0), last: Number(box.dataset[`last${r}`] || 0),
                                       peak: Number(box.dataset[`peak${r}`] || 0),
                                       mlxLast: Number(box.dataset[`mlxOpsLast${r}`] || box.dataset[`mlxBytesLast${r}`] || 0) })),
           legend: [...box.querySelectorAll('.u-legend .u-series')].map((l) => l.innerText.trim().split(/\s+/).slice(0, 3).join(' ')) };
}, key);

let clusterId = '';
try {
  await step('dash_kernel_cluster_starts', async () => {
    await openNotebook('train.ipynb');
    await pin();
    const text = await runToEnd(0);
    if (!/2 ranks ready/.test(text)) throw new Error(`the cluster did not start: ${text.slice(0, 300)}`);
    // every alarm the dashboard shows, with when: a healthy loop must add none
    await page.evaluate(() => {
      window.mlxjAlarms = [];
      new MutationObserver(() => {
        const d = document.querySelector('.mlxj-dashboard .mlxj-dash-diagnosis');
        if (d) window.mlxjAlarms.push({ at: Date.now(), text: d.textContent });
      }).observe(document.body, { childList: true, subtree: true });
    });
  });

  let loopStarted = 0;
  await step('dash_kernel_cluster_has_charts_and_mlx_memory', async () => {
    await page.locator('.jp-SideBar .lm-TabBar-tab[data-id="mlx-jupyter-cluster-panel"]').click();
    const card = panel.locator('.mlxj-card', { hasText: 'kernel pid' });
    await card.waitFor({ timeout: 20000 });
    clusterId = await card.getAttribute('data-cluster');
    await card.locator('button.mlxj-open-dashboard').click();
    await dash.locator('.mlxj-dash-ranks tr[data-rank]').nth(1).waitFor({ timeout: 10000 });
    loopStarted = Date.now();
    runCell(1).catch((e) => logs.push(`run-cell: ${e}`));
    // the loop's ops on both ranks, and MLX's memory (16 MiB of weights) in the table and its chart
    await page.waitForFunction(() => {
      const box = document.querySelector('.mlxj-dashboard .mlxj-dash-chart-ops');
      const mlx = document.querySelector('.mlxj-dashboard .mlxj-dash-chart-mlx');
      return box && Number(box.dataset.last0 || 0) > 0 && Number(box.dataset.last1 || 0) > 0
        && Number(box.dataset.mlxOpsLast0 || 0) > 0 && Number(box.dataset.mlxOpsLast1 || 0) > 0
        && Number(box.dataset.points0 || 0) >= 4 && mlx && Number(mlx.dataset.peak0 || 0) >= 16 * 2 ** 20;
    }, null, { timeout: 40000 });
    const ops = await chart('ops');
    const mlx = await chart('mlx');
    const cpu = await chart('cpu');
    const table = await dash.locator('.mlxj-dash-ranks tr[data-rank]').evaluateAll((trs) => trs.map((tr) => ({
      rss: tr.querySelector('.mlxj-dash-memory')?.textContent, active: tr.querySelector('.mlxj-dash-mlx-active')?.textContent,
      peak: tr.querySelector('.mlxj-dash-mlx-peak')?.textContent, cache: tr.querySelector('.mlxj-dash-mlx-cache')?.textContent })));
    const note = await dash.locator('.mlxj-dash-note').allInnerTexts();
    // values on hover: the cursor over the CPU chart's middle fills its legend with the time and each rank's value
    const over = dash.locator('.mlxj-dash-chart-cpu .u-over');
    const box = await over.boundingBox();
    await page.mouse.move(box.x + box.width * 0.9, box.y + box.height / 2);
    await page.waitForFunction(() => [...document.querySelectorAll('.mlxj-dashboard .mlxj-dash-chart-cpu .u-legend .u-value')]
      .every((v) => v.textContent && v.textContent !== '–'), null, { timeout: 5000 });
    const legend = await dash.locator('.mlxj-dash-chart-cpu .u-legend .u-series').allInnerTexts();
    await page.screenshot({ path: shot('dashboard-kernel-cluster.png') });
    await dash.screenshot({ path: shot('dashboard-kernel-cluster-tab.png') });
    const mib = /^(active |peak )?\d+(\.\d)? MiB$/;
    const bytes = await chart('bytes');
    // MLX's own calls beside ours: a line each per rank, named in the legend (time, then rank 0's and rank 1's)
    const named = ['time', 'rank 0 mlx_jupyter', 'rank 0 mx.distributed', 'rank 1 mlx_jupyter', 'rank 1 mx.distributed'];
    const ok = [0, 1].every((r) => ops.ranks[r].last > 0 && ops.ranks[r].mlxLast > 0 && bytes.ranks[r].mlxLast >= 1024
                            && mlx.ranks[r].peak >= 16 * 2 ** 20) && cpu.canvas && mlx.canvas
      && named.every((n, i) => (ops.legend[i] || '').startsWith(n))
      && table.every((t) => mib.test(t.rss) && mib.test(t.active) && mib.test(t.peak) && !!t.cache)
      && !note.some((n) => /No charts/.test(n)) && legend.length === 3 && /^time\s*\d\d:\d\d:\d\d$/.test(legend[0].trim())
      && legend.slice(1).every((l) => /^rank [01]\s*\d+%$/.test(l.trim()));
    record('dash_kernel_cluster_has_charts_and_mlx_memory', ok,
      `ops=${JSON.stringify(ops)} bytes=${JSON.stringify(bytes)} mlx=${JSON.stringify(mlx)} table=${JSON.stringify(table)} legend=${JSON.stringify(legend)}`);
  });

  await step('dash_window_choice', async () => {
    // 1 min and 15 min: the heading says the window; the charts keep their points
    await dash.locator('button.mlxj-dash-window-choice', { hasText: /^1 min$/ }).click();
    await page.waitForFunction(() => /window 1 min|last 1 min/.test(document.querySelector('.mlxj-dashboard .mlxj-dash-charts-bar h3')?.textContent || ''),
      null, { timeout: 5000 });
    const one = await dash.locator('.mlxj-dash-charts-bar h3').innerText();
    const pressed = await dash.locator('button.mlxj-dash-window-choice[aria-pressed="true"]').innerText();
    await dash.screenshot({ path: shot('dashboard-window-1min.png') });
    await dash.locator('button.mlxj-dash-window-choice', { hasText: '15 min' }).click();
    await page.waitForFunction(() => /window 15 min|last 15 min/.test(document.querySelector('.mlxj-dashboard .mlxj-dash-charts-bar h3')?.textContent || ''),
      null, { timeout: 5000 });
    await dash.locator('button.mlxj-dash-window-choice', { hasText: /^5 min$/ }).click();
    record('dash_window_choice', pressed === '1 min', `heading=${one} pressed=${pressed}`);
  });

  await step('dash_healthy_loop_raises_no_alarm', async () => {
    await kernelIdle();
    const text = await cellText(1);
    const alarms = await page.evaluate(() => window.mlxjAlarms);
    record('dash_healthy_loop_raises_no_alarm', alarms.length === 0 && /done/.test(text) || alarms.length === 0 && !/Error/.test(text),
      `alarms during the loop (${((Date.now() - loopStarted) / 1000).toFixed(1)} s): ${JSON.stringify(alarms.slice(0, 3))} cell=${text.slice(0, 200)}`);
  });

  await step('dash_stalled_rank_raises_the_alarm', async () => {
    const t0 = Date.now();
    runCell(2).catch((e) => logs.push(`run-cell: ${e}`));
    const seen = await page.waitForFunction(() => {
      const d = document.querySelector('.mlxj-dashboard .mlxj-dash-diagnosis');
      return d && /waiting on rank 1/.test(d.textContent) ? d.textContent : '';
    }, null, { timeout: 15000 }).then((h) => h.jsonValue());
    const after = Date.now() - t0;
    await page.screenshot({ path: shot('dashboard-stalled.png') });
    await kernelIdle();
    record('dash_stalled_rank_raises_the_alarm', after >= 2000 && after < 6000, `shown after ${after} ms: ${seen}`);
  });

  await step('dash_dark_theme_and_profile_timeline', async () => {
    const text = await runToEnd(3);
    const svg = await page.evaluate(() => {
      const cell = (window.mlxjPinned || window.jupyterapp.shell.currentWidget).content.widgets[3].node;
      const img = cell.querySelector('.jp-RenderedSVG img');
      return img ? decodeURIComponent(img.src.slice(img.src.indexOf(',') + 1)) : '';
    });
    await themeTo(page, 'JupyterLab Dark', 'false');
    await page.evaluate(() => window.jupyterapp.shell.activateById(window.mlxjPinned.id));
    const picture = page.locator('.jp-Notebook .jp-Cell').nth(3).locator('.jp-RenderedSVG').first();
    await picture.scrollIntoViewIfNeeded();
    await picture.screenshot({ path: shot('profile-timeline-dark.png') });
    await page.waitForFunction(() => document.querySelector('.mlxj-dashboard .mlxj-dash-chart-cpu canvas'), null, { timeout: 10000 });
    await dash.screenshot({ path: shot('dashboard-kernel-cluster-tab-dark.png') });
    const ticks = [...svg.matchAll(/text-anchor="middle">([^<]+)</g)].map((m) => m[1]);
    record('dash_dark_theme_and_profile_timeline', /fill="#ffffff"/.test(svg) && ticks.length >= 3
      && ticks.every((t) => /^(0|\d+(\.\d)? (ms|s|µs))$/.test(t)) && /op records on 2 ranks/.test(text), `ticks=${ticks}`);
  });

  await step('dash_second_dashboard_opens_as_a_tab', async () => {
    // another process's cluster (this node process stands for it) opened second: a tab beside the first dashboard
    const folder = path.join(path.dirname(resultsFile), 'runtime', 'mlx-jupyter', 'clusters');
    const file = path.join(folder, 'mlx-second.json');
    fs.writeFileSync(file, JSON.stringify({ id: 'mlx-second', owner: 'kernel', owner_pid: process.pid, backend: 'ring',
      hosts: ['127.0.0.1'], size: 2, busy: [], ranks: [] }));
    try {
      await run('mlx-jupyter:show-panel');   // a click on its tab would close it: it is open
      await panel.locator('button.mlxj-others-toggle').click();
      const card = panel.locator('.mlxj-others .mlxj-card[data-cluster="mlx-second"]');
      await card.waitFor({ timeout: 10000 });
      await card.locator('button.mlxj-open-dashboard').click();
      await page.locator('.mlxj-dashboard[data-cluster="mlx-second"]').waitFor({ timeout: 10000 });
      const layout = await page.evaluate((first) => {
        const bars = [...document.querySelectorAll('#jp-main-dock-panel .lm-DockPanel-tabBar')];
        const holding = (label) => bars.findIndex((b) => [...b.querySelectorAll('.lm-TabBar-tabLabel')].some((t) => t.textContent === label));
        const main = document.querySelector('#jp-main-dock-panel').getBoundingClientRect().width;
        const nb = window.mlxjPinned.node.getBoundingClientRect().width;
        return { bars: bars.length, first: holding(`MLX ${first}`), second: holding('MLX mlx-second'), share: nb / main };
      }, clusterId);
      await page.screenshot({ path: shot('dashboard-two-tabs.png') });
      record('dash_second_dashboard_opens_as_a_tab', layout.bars === 2 && layout.first >= 0 && layout.first === layout.second
        && layout.share > 0.35, JSON.stringify(layout));
    } finally {
      fs.rmSync(file, { force: true });
      await page.evaluate(() => [...window.jupyterapp.shell.widgets('main')]
        .filter((w) => w.hasClass('mlxj-dashboard')).forEach((w) => w.close()));
      await themeTo(page, 'JupyterLab Light', 'true');
    }
  });

  // The card's layout on a listing the test gives (the panel's GET clusters answered here): a cluster starting and
  // one of the panel's, restarted; on a page whose clock the test moves (the confirmation must not lapse)
  await step('panel_card_layout', async () => {
    const p = await browser.newPage();
    await p.clock.install();
    const listing = [
      { id: 'mlx-starting', owner: 'server', owner_pid: 1, backend: 'ring', hosts: ['127.0.0.1'], size: 2, state: 'starting',
        connected: 1, owner_text: 'started from this panel', ranks: [{ rank: 0, host: '127.0.0.1', pid: 11 }, { rank: 1, host: '127.0.0.1', pid: 12 }] },
      { id: 'mlx-restarted', owner: 'server', owner_pid: 1, backend: 'ring', hosts: ['127.0.0.1'], size: 2, state: 'running',
        owner_text: 'started from this panel', restart_report: 'restart: kept 3 names on 2 ranks (rank 1 from rank 0)',
        ranks: [0, 1].map((r) => ({ rank: r, host: '127.0.0.1', pid: 2000 + r, state: 'idle', health: 'ok', where: 'idle',
          memory: 123456789, memory_text: '117.7 MiB', restart: r ? 'from rank 0 (3 names)' : 'its own names' })) }];
    await p.route(/\/mlx-jupyter\/clusters(\?.*)?$/, (route) => route.request().method() === 'GET'
      ? route.fulfill({ contentType: 'application/json', body: JSON.stringify({ clusters: listing }) }) : route.continue());
    await p.goto(`${base}lab?reset&token=${token}`);
    await p.waitForFunction(() => window.jupyterapp && window.jupyterapp.shell, null, { timeout: 60000 });
    await p.locator('.jp-SideBar .lm-TabBar-tab[data-id="mlx-jupyter-cluster-panel"]').click();
    const cards = p.locator('#mlx-jupyter-cluster-panel .mlxj-card');
    await cards.nth(1).waitFor({ timeout: 20000 });
    const starting = await p.locator('.mlxj-card[data-cluster="mlx-starting"]').innerText();
    const running = p.locator('.mlxj-card[data-cluster="mlx-restarted"]');
    const look = await running.evaluate((card) => {
      const right = card.getBoundingClientRect().right;
      const buttons = [...card.querySelectorAll('.mlxj-card-actions button')].map((b) => b.getBoundingClientRect());
      return {
        columns: [...card.querySelectorAll('.mlxj-ranks th')].map((th) => th.textContent),
        memoryInside: [...card.querySelectorAll('td.mlxj-col-memory')].every((td) => td.getBoundingClientRect().right <= right + 0.5),
        titles: [...card.querySelectorAll('.mlxj-ranks tr[data-pid]')].map((tr) => tr.title),
        rows: new Set(buttons.map((b) => Math.round(b.top))).size, buttons: buttons.length,
        widths: new Set(buttons.map((b) => Math.round(b.width))).size,
        restartLines: [...card.querySelectorAll('.mlxj-card-restart')].length };
    });
    await p.screenshot({ path: shot('panel-card-layout.png') });
    await running.locator('button.mlxj-restart').click();
    await running.locator('.mlxj-confirm-box').waitFor({ timeout: 5000 });
    await p.clock.fastForward(30000);   // half a minute of the panel's refreshes: the question is still asked
    await p.evaluate(() => new Promise((r) => requestAnimationFrame(() => r())));
    const asked = await running.locator('.mlxj-confirm-box').count();
    await p.screenshot({ path: shot('panel-confirm-stays.png') });
    await themeTo(p, 'JupyterLab Dark', 'false');
    await running.locator('button.mlxj-cancel').click();
    await p.locator('#mlx-jupyter-cluster-panel').screenshot({ path: shot('panel-card-layout-dark.png') });
    await themeTo(p, 'JupyterLab Light', 'true');
    await p.close();
    const ok = /starting: 1 of 2 ranks connected/.test(starting) && !/not ok/.test(starting)
      && !look.columns.includes('names from') && look.columns.includes('memory') && look.memoryInside
      && look.titles[1].includes('from rank 0 (3 names)') && look.buttons === 4 && look.rows === 2 && look.widths === 1
      && look.restartLines === 1 && asked === 1;
    record('panel_card_layout', ok, `starting=${JSON.stringify(starting)} look=${JSON.stringify(look)} asked=${asked}`);
  });

  await step('dash_cluster_stops', async () => {
    const text = await runToEnd(4);
    if (!/stopped/.test(text)) throw new Error(text.slice(0, 300));
  });
} finally {
  record('console_errors', logs.length === 0, logs.slice(0, 10).join(' | ') || 'none');
  await finish();
}
