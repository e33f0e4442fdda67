/** The dashboard's table of ranks: host, pid, health, where each one is, where its names came from at the
 * last restart, its memory (RSS) and MLX's own (active, peak, cache) for ranks that imported MLX. */
import { IRank } from './api';
import { formatBytes } from './charts';

function cell(cls: string, text: string): HTMLTableCellElement {
  const td = document.createElement('td');
  td.className = cls;
  td.textContent = text;
  return td;
}

/** What a rank is doing, in words: the where model's line when there is one, else its state or health. */
function doing(r: IRank): string {
  return r.where || r.state || r.health || 'unknown';
}

/** MLX's memory of a rank in one cell, a line per figure (three columns did not fit a tab beside a notebook). */
function mlxCell(r: IRank): HTMLTableCellElement {
  const td = cell('mlxj-dash-mlx mlxj-num', '');
  for (const key of ['active', 'peak', 'cache'] as const) {
    const v = r.mlx_memory?.[key];
    if (typeof v === 'number') {
      const line = document.createElement('div');
      line.className = `mlxj-dash-mlx-${key}`;
      line.textContent = `${key} ${formatBytes(v)}`;
      td.appendChild(line);
    }
  }
  return td;
}

/** The table of `ranks`, in a box that scrolls sideways in a narrow tab; a column only where some rank has a
 * value for it, and the host only when the ranks are on several (else the line above says it). */
export function rankTable(ranks: IRank[]): HTMLElement {
  const restarted = ranks.some(r => r.restart);
  const withMlx = ranks.some(r => r.mlx_memory);
  const hosts = new Set(ranks.map(r => r.host)).size > 1;
  const table = document.createElement('table');
  table.className = 'mlxj-dash-ranks';
  const names = ['rank', ...(hosts ? ['host'] : []), 'pid', 'health', 'state', ...(restarted ? ['names from'] : []), 'RSS',
    ...(withMlx ? ['MLX memory'] : [])];
  const hr = document.createElement('tr');
  for (const name of names) {
    const th = document.createElement('th');
    th.textContent = name;
    if (name.startsWith('MLX') || name === 'RSS') {
      th.className = 'mlxj-num';
      th.title = name === 'RSS' ? 'the process\'s resident memory'
        : 'MLX\'s own: mx.get_active_memory(), mx.get_peak_memory(), mx.get_cache_memory()';
    }
    hr.appendChild(th);
  }
  table.appendChild(hr);
  for (const r of ranks) {
    const tr = document.createElement('tr');
    tr.className = `mlxj-health-${r.health || 'unknown'}`;
    tr.setAttribute('data-rank', String(r.rank));
    tr.appendChild(cell('mlxj-dash-rank', String(r.rank)));
    if (hosts) {
      tr.appendChild(cell('mlxj-dash-host', r.host));
    }
    tr.appendChild(cell('mlxj-dash-pid', String(r.pid ?? '?')));
    tr.appendChild(cell('mlxj-col-health', r.health || 'unknown'));
    tr.appendChild(cell('mlxj-dash-state', doing(r)));
    if (restarted) {
      tr.appendChild(cell('mlxj-dash-restart-origin', r.restart || ''));
    }
    const memory = cell('mlxj-dash-memory mlxj-num', '');
    const value = document.createElement('span');
    value.className = 'mlxj-dash-value';
    value.textContent = typeof r.memory === 'number' ? r.memory_text || '' : '';
    memory.appendChild(value);
    tr.appendChild(memory);
    if (withMlx) {
      tr.appendChild(mlxCell(r));
    }
    table.appendChild(tr);
  }
  const box = document.createElement('div');
  box.className = 'mlxj-dash-ranks-box';
  box.appendChild(table);
  return box;
}
