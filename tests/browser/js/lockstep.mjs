// Drives JupyterLab in headless chromium through the lockstep pdb prompt: breakpoint() on 4 ranks, one
// prompt in the notebook's stdin box. Usage: node lockstep.mjs <lab url> <token> <screenshot dir> <results.json>
// Each check is recorded in results.json ({name: {ok, detail}}); pytest asserts on them.
import { answer, cellText, finish, kernelIdle, openNotebook, page, results, runCell, runToEnd, shot, start, step, stopAfterPdb }
  from './scenario.mjs';

await start();

try {
  await step('lockstep_notebook_opens', async () => {
    await openNotebook('lockstep.ipynb');
    const text = await runToEnd(0);
    if (!/4 ranks ready/.test(text)) throw new Error(`the cluster did not start: ${text}`);
  });

  await step('lockstep_prompt_groups_the_answers', async () => {
    runCell(1).catch(() => {});
    const first = await answer('p loss');
    if (!first.includes('(Pdb ranks 0-3)')) throw new Error(`prompt ${JSON.stringify(first)}`);
    await page.locator('input.jp-Stdin-input').last().waitFor({ state: 'visible', timeout: 60000 });
    await page.waitForFunction(() => {
      const t = window.jupyterapp.shell.currentWidget.content.widgets[1].node
        .querySelector('.jp-Cell-outputWrapper')?.innerText || '';
      return /^\[ranks 0-2\] 3\.0$/m.test(t) && /^\[rank 3\] nan$/m.test(t);
    }, null, { timeout: 30000 });
    await page.locator('input.jp-Stdin-input').last().scrollIntoViewIfNeeded();
    await page.screenshot({ path: shot('pdb-lockstep.png') });
  });

  await step('lockstep_continue_lets_every_rank_go_on', async () => {
    const prompt = await answer('c');
    if (!prompt.includes('(Pdb ranks 0-3)')) throw new Error(`prompt ${JSON.stringify(prompt)}`);
    await kernelIdle();
    const text = await cellText(1);
    const wants = [/--- pdb on ranks 0-3 together/, /^\[ranks 0-3\] total \[10\]$/m];
    for (const want of wants) {
      if (!want.test(text)) throw new Error(`no ${want} in: ${JSON.stringify(text.slice(-600))}`);
    }
  });

  await step('lockstep_cluster_stops', async () => {
    await stopAfterPdb(2, !results.lockstep_continue_lets_every_rank_go_on?.ok);
  });
} finally {
  await finish();
}
