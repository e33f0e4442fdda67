// Drives JupyterLab in headless chromium through issue 45 §6, one story in three places: a kernel's cluster
// (%mlx_cluster start) whose cell hangs in MLX's all_sum on rank 0 while rank 1 is done; the cell's table, the
// dashboard's headline and the panel's card name the same op, number, line and culprit, and the card says which rank
// still runs and which is done; after a cell that shut MLX's `world` down, the card and the dashboard say so, with
// how to restart, in the words of the cell's refusal. Light and dark screenshots: story-*.png.
// Usage: node story.mjs <lab url> <token> <screenshot dir> <results.json>
import { finish, results, kernelIdle, logs, openNotebook, page, pin, record, run, runCell, runToEnd, shot, start, step,
  cellText } from './scenario.mjs';

await start({ viewport: { width: 1500, height: 1000 }, prefix: 'failed-story-' });
const panel = page.locator('#mlx-jupyter-cluster-panel');
const dash = page.locator('.mlxj-dashboard').first();

async function themeTo(name, light) {
  await page.evaluate((n) => window.jupyterapp.commands.execute('apputils:change-theme', { theme: n }), name);
  await page.waitForFunction((l) => document.body.dataset.jpThemeLight === l && !document.querySelector('#jupyterlab-splash'),
    light, { timeout: 20000 });
  await page.waitForTimeout(500);   // the theme's fade: a screenshot of the page as it settles, not mid-change
}

// the three faces' words now: the cell's live table (its one-line diagnosis), the dashboard's, the card's
const faces = () => page.evaluate(() => {
  const nb = window.mlxjPinned;
  const cell = nb.content.widgets[1].node.querySelector('.mlxj-where-diagnosis');
  const text = (sel) => document.querySelector(sel)?.textContent || '';
  return { cell: cell ? cell.textContent : '', dashboard: text('.mlxj-dashboard .mlxj-dash-diagnosis'),
           dashStory: text('.mlxj-dashboard .mlxj-dash-story'), card: text('#mlx-jupyter-cluster-panel .mlxj-card-diagnosis'),
           health: text('#mlx-jupyter-cluster-panel .mlxj-card-health') };
});
// a rank's seconds in a wait move on between two looks: compared without them
const still = (s) => s.replace(/ for \d+\.\d s/g, '');

try {
  await step('story_cluster_and_its_faces_open', async () => {
    await openNotebook('story.ipynb');
    await pin();
    const text = await runToEnd(0);
    if (!/2 ranks ready/.test(text)) throw new Error(`the cluster did not start: ${text.slice(0, 300)}`);
    await page.locator('.jp-SideBar .lm-TabBar-tab[data-id="mlx-jupyter-cluster-panel"]').click();
    const card = panel.locator('.mlxj-card', { hasText: 'kernel pid' });
    await card.waitFor({ timeout: 20000 });
    await card.locator('button.mlxj-open-dashboard').click();
    await dash.locator('.mlxj-dash-ranks tr[data-rank]').nth(1).waitFor({ timeout: 10000 });
    // the notebook beside the dashboard: the cell's table, the dashboard and the card in one screenshot
    await page.evaluate(() => window.jupyterapp.shell.activateById(window.mlxjPinned.id));
  });

  await step('story_hang_same_words_in_three_places', async () => {
    runCell(1).catch((e) => logs.push(`run-cell: ${e}`));
    try {
    await page.waitForFunction(() => {
      const t = (sel) => document.querySelector(sel)?.textContent || '';
      const cell = window.mlxjPinned.content.widgets[1].node.querySelector('.mlxj-where-diagnosis')?.textContent || '';
      return /waits in MLX all_sum #1/.test(cell) && /waits in MLX all_sum #1/.test(t('.mlxj-dashboard .mlxj-dash-diagnosis'))
        && /waits in MLX all_sum #1/.test(t('#mlx-jupyter-cluster-panel .mlxj-card-diagnosis'))
        && /done on rank 1/.test(t('#mlx-jupyter-cluster-panel .mlxj-card-health'));
    }, null, { timeout: 30000 });
    } catch (e) {
      record('story_hang_same_words_in_three_places', false, `${e.message.split('\n')[0]}: ${JSON.stringify(await faces())}`);
    }
    const seen = await faces();
    await page.screenshot({ path: shot('story-hang.png') });
    await themeTo('JupyterLab Dark', 'false');
    await page.screenshot({ path: shot('story-hang-dark.png') });
    await themeTo('JupyterLab Light', 'true');
    await page.evaluate(() => window.jupyterapp.shell.activateById(window.mlxjPinned.id));
    await run('notebook:interrupt-kernel');   // the Stop button
    await kernelIdle();
    const stopped = await cellText(1);
    if ('story_hang_same_words_in_three_places' in results) return;
    const same = still(seen.cell) === still(seen.dashboard) && still(seen.cell) === still(seen.card);
    record('story_hang_same_words_in_three_places', same && /running a cell on rank 0; done on rank 1/.test(seen.health)
      && !/running a cell on ranks 0/.test(seen.health) && /done on rank 1/.test(seen.dashStory)
      && /where the ranks were when stopped: rank 0 waits in MLX all_sum #1/.test(stopped),
    `${JSON.stringify(seen)} stopped=${JSON.stringify(stopped.slice(0, 600))}`);
  });

  await step('story_world_shut_down_said_everywhere', async () => {
    await runToEnd(2);   // rank 1 raises where rank 0 waits in a call no drain can make: world is shut down
    const refused = await runToEnd(3);   // the next cell using world: refused, in one line
    // the refusal's words up to ", so this cell": MLX's `world` is shut down (shut down on rank 0 after: ...)
    const said = (refused.match(/MLX's `world` is shut down \(shut down on .*?\)(?=, so this cell)/) || [''])[0];
    await page.waitForFunction((s) => {
      const t = (sel) => document.querySelector(sel)?.textContent || '';
      return s && t('#mlx-jupyter-cluster-panel .mlxj-card-health').includes(s) && t('.mlxj-dashboard .mlxj-dash-story').includes(s);
    }, said, { timeout: 20000 }).catch(() => {});
    const seen = await faces();
    await page.screenshot({ path: shot('story-world-shut-down.png') });
    await themeTo('JupyterLab Dark', 'false');
    await page.screenshot({ path: shot('story-world-shut-down-dark.png') });
    await themeTo('JupyterLab Light', 'true');
    const restart = "for a new `world`, restart it in that kernel's notebook with %mlx_cluster restart";
    record('story_world_shut_down_said_everywhere', !!said && seen.health.includes(said) && seen.dashStory.includes(said)
      && seen.health.includes(restart) && seen.dashStory.includes(restart) && !/^2 of 2 ranks ok, idle$/.test(seen.health),
    `said=${JSON.stringify(said)} seen=${JSON.stringify(seen)} refused=${JSON.stringify(refused.slice(0, 400))}`);
  });

  await step('story_cluster_stops', async () => {
    await page.evaluate(() => [...window.jupyterapp.shell.widgets('main')]   // a dashboard left open asks for a
      .filter((w) => w.hasClass('mlxj-dashboard')).forEach((w) => w.close()));   // stopped cluster: 404s
    const text = await runToEnd(4);
    if (!/stopped/.test(text)) throw new Error(text.slice(0, 300));
  });
} finally {
  record('console_errors', logs.length === 0, logs.slice(0, 10).join(' | ') || 'none');
  await finish();
}
