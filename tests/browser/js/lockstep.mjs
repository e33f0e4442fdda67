// Drives JupyterLab in headless chromium through the lockstep pdb prompt: breakpoint() on 4 ranks, one
// prompt in the notebook's stdin box. Usage: node lockstep.mjs <lab url> <token> <screenshot dir> <results.json>
// Each check is recorded in results.json ({name: {ok, detail}}); pytest asserts on them.
import { answer, base, browser, cellText, kernelIdle, page, results, runCell, save, shots, step, token } from './scenario.mjs';
import path from 'node:path';

try {
  await step('lockstep_notebook_opens', async () => {
    await page.goto(`${base}lab/tree/lockstep.ipynb?reset&token=${token}`);
    await page.waitForFunction(() => window.jupyterapp && window.jupyterapp.shell, null, { timeout: 60000 });
    await page.waitForSelector('.jp-Notebook .jp-Cell', { timeout: 60000 });
    const dialog = page.locator('.jp-Dialog .jp-mod-accept');
    if (await dialog.count()) await dialog.first().click();
    await kernelIdle();
    await runCell(0);
    await kernelIdle();
    const text = await cellText(0);
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
    await page.screenshot({ path: path.join(shots, 'pdb-lockstep.png') });
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
    if (!results.lockstep_continue_lets_every_rank_go_on?.ok) {  // a session left open: the stop button ends it
      await page.evaluate(() => window.jupyterapp.commands.execute('notebook:interrupt-kernel'));
      await kernelIdle();
    }
    await runCell(2);
    await kernelIdle();
  });
} finally {
  save();
  await browser.close();
}
