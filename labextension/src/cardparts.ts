/** The parts of a cluster's card in the sidebar panel: its health in words, its rank table, its error. */
import { IRank } from './api';

/** An element with attributes and text. */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    node.setAttribute(k, v);
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** A rank's memory as the server formats it (mlx_jupyter.cluster.cells.text.format_bytes); '' when unknown. */
function memory(r: IRank): string {
  return r.memory === null || r.memory === undefined ? '' : r.memory_text || '';
}

/** "2 of 2 ranks ok": the health summary written out, not only as a colour; then what the ranks do: the server's
 * story (mlx_jupyter.server.live.story, in the words of the cell's own table: "running a cell on rank 0; done on
 * rank 1", "idle; MLX's `world` is shut down (...)") when it has one, else the owner's listing. */
export function healthSummary(ranks: IRank[], story = ''): string {
  const ok = ranks.filter(r => ['ok', 'idle', 'running'].includes(r.health || '')).length;
  const remote = ranks.filter(r => r.health === 'remote').length;
  const bad = ranks.length - ok - remote;
  // ranks on other hosts (a Slurm job's nodes): ok by the owning notebook's record, said with their hosts
  const away = [...new Set(ranks.filter(r => r.health_from === 'owner').map(r => r.host))];
  const parts = [`${ok} of ${ranks.length} ranks ok${away.length ? ` (on ${away.join(', ')})` : ''}`];
  if (remote) {
    parts.push(`${remote} on another host: health from the owning notebook`);
  }
  if (bad) {
    parts.push(`${bad} not ok`);
  }
  if (story) {
    parts.push(story);
    return parts.join(', ');
  }
  // before the server's first look at the ranks: what the owner's listing says they do
  const busy = ranks.filter(r => r.state === 'running a cell').map(r => r.rank);
  if (busy.length) {
    parts.push(`running a cell on rank${busy.length > 1 ? 's' : ''} ${busy.join(', ')}`);
  } else if (ranks.length && ranks.every(r => r.state === 'idle')) {
    parts.push('idle');
  }
  return parts.join(', ');
}

/** Errors longer than this show their first part, with "more" to read the rest. */
const ERROR_PREVIEW = 160;

/** A cluster's error: wrapped to the sidebar's width; a long one collapsed behind "more". */
export function errorBox(error: string): HTMLElement {
  if (error.length <= ERROR_PREVIEW) {
    return el('pre', { class: 'mlxj-error' }, error);
  }
  const box = el('details', { class: 'mlxj-error mlxj-error-long' });
  const summary = el('summary', { class: 'mlxj-error-summary' });
  summary.appendChild(el('span', { class: 'mlxj-error-preview' }, `${error.slice(0, ERROR_PREVIEW).trimEnd()}…`));
  summary.appendChild(el('span', { class: 'mlxj-more' }, ' more'));
  box.appendChild(summary);
  box.appendChild(el('pre', { class: 'mlxj-error-full' }, error));
  return box;
}

/** One row per rank. The host column only when the ranks are on several hosts (else it is in the card),
 * and no column that is empty for every rank. Where a rank's names came from at the last restart is its row's
 * tooltip and the dashboard's column: a column of its own pushed the memory off the sidebar's card. */
export function rankTable(ranks: IRank[]): HTMLTableElement {
  const several = new Set(ranks.map(r => r.host)).size > 1;
  const all: [string, (r: IRank) => string][] = [
    ['rank', r => String(r.rank)],
    ['host', r => (several ? r.host : '')],
    ['pid', r => String(r.pid ?? '')],
    ['health', r => r.health || 'unknown'],
    ['state', r => (r.state && r.state !== r.health ? r.state : '')],
    ['memory', r => memory(r)]
  ];
  const cols = all.filter(([, value]) => ranks.some(r => value(r) !== ''));
  const table = el('table', { class: 'mlxj-ranks' });
  const hr = el('tr');
  for (const [name] of cols) {
    hr.appendChild(el('th', { class: `mlxj-col-${name.replace(' ', '-')}` }, name));
  }
  table.appendChild(hr);
  for (const r of ranks) {
    const tr = el('tr', { class: `mlxj-health-${r.health || 'unknown'}`, 'data-pid': String(r.pid ?? '') });
    if (r.restart) {
      tr.title = `rank ${r.rank}'s names at the last restart: ${r.restart}`;
      tr.dataset.restart = r.restart;
    }
    for (const [name, value] of cols) {
      tr.appendChild(el('td', { class: `mlxj-col-${name.replace(' ', '-')}` }, value(r)));
    }
    table.appendChild(tr);
  }
  return table;
}

