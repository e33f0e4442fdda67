// Drives JupyterLab in headless chromium through a rank's pdb: breakpoint() on rank 1 answered in the
// notebook's stdin box. Usage: node debug.mjs <lab url> <token> <screenshot dir> <results.json>
// Each check is recorded in results.json ({name: {ok, detail}}); pytest asserts on them.
import { answer, cellText, finish, kernelIdle, openNotebook, page, results, runCell, runToEnd, shot, start, step, stopAfterPdb }
  from './scenario.mjs';

await start();

try {
  await step('debug_notebook_opens', async () => {
    await openNotebook('debug.ipynb');
    const text = await runToEnd(0);
    if (!/2 ranks ready/.test(text)) throw new Error(`the cluster did not start: ${text}`);
  });

  await step('debug_live_table_names_pdb', async () => {
    // while rank 1's prompt waits, the live table under the cell names it in pdb and rank 0 waiting on it
    runCell(1).catch(() => {});
    await page.locator('input.jp-Stdin-input').last().waitFor({ state: 'visible', timeout: 60000 });
    await page.waitForFunction(() => {
      const t = window.jupyterapp.shell.currentWidget.content.widgets[1].node.querySelector('.mlxj-where')?.textContent || '';
      return /in pdb \(line 7\)/.test(t) && /waiting on rank 1 \(in pdb\) for [\d.]+ s; times out after 60 s/.test(t);
    }, null, { timeout: 30000 });
    // the table is drawn anew each second: scroll to whichever element is there now (a locator's
    // element could be replaced between its lookup and the scroll)
    await page.evaluate(() => { const t = document.querySelectorAll('.mlxj-where'); t[t.length - 1]?.scrollIntoView({ block: 'center' }); });
    await page.screenshot({ path: shot('live-where-pdb.png') });
  });

  await step('debug_prompt_answered', async () => {
    const first = await answer('p x');
    if (!first.includes('(Pdb rank 1)')) throw new Error(`prompt ${JSON.stringify(first)}`);
    await page.locator('input.jp-Stdin-input').last().waitFor({ state: 'visible', timeout: 60000 });
    await page.screenshot({ path: shot('pdb-rank-1.png') });
    await answer('c');
    await kernelIdle();
    const text = await cellText(1);
    const wants = [/--- pdb on rank 1/, /\(Pdb rank 1\)\s+p x\n/, /^20$/m, /^\[rank 0\] rank 0 y 11 total 32$/m,
                   /^\[rank 1\] rank 1 y 21 total 32$/m];
    for (const want of wants) {
      if (!want.test(text)) throw new Error(`no ${want} in: ${JSON.stringify(text.slice(-600))}`);
    }
  });

  await step('debug_cluster_stops', async () => {
    await stopAfterPdb(2, !results.debug_prompt_answered?.ok);
  });
} finally {
  await finish();
}
