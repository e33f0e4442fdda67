import { Widget } from '@lumino/widgets';

import { ICluster, IRank, getCluster } from './api';

/** The dashboard refreshes once a second while it is visible (and never while hidden). */
const REFRESH_MS = 1000;
/** Memory history kept per rank for the small charts: the last five minutes at 1 Hz. */
const HISTORY = 300;

function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls = '', text?: string): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** A small line chart of the values (oldest first), scaled to their own maximum. */
function sparkline(values: number[], title: string): SVGSVGElement {
  const NS = 'http://www.w3.org/2000/svg';
  const w = 120, h = 22;
  const svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('class', 'mlxj-dash-spark');
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svg.setAttribute('width', String(w));
  svg.setAttribute('height', String(h));
  const t = document.createElementNS(NS, 'title');
  t.textContent = title;
  svg.appendChild(t);
  if (values.length > 1) {
    const max = Math.max(...values) || 1;
    const step = w / (HISTORY - 1);
    const x0 = w - step * (values.length - 1);
    const points = values.map((v, i) => `${(x0 + i * step).toFixed(1)},${(h - 2 - (v / max) * (h - 4)).toFixed(1)}`);
    const line = document.createElementNS(NS, 'polyline');
    line.setAttribute('points', points.join(' '));
    line.setAttribute('class', 'mlxj-dash-spark-line');
    svg.appendChild(line);
  }
  return svg;
}

/** What a rank is doing, in words: the where model's line when there is one, else its state or health. */
function doing(r: IRank): string {
  return r.where || r.state || r.health || 'unknown';
}

/** A cluster's live dashboard, in a main-area tab: its ranks, where each one is, memory over time, its Slurm job. */
export class ClusterDashboard extends Widget {
  constructor(readonly clusterId: string) {
    super();
    this.id = `mlx-jupyter-dashboard-${clusterId}`;
    this.title.label = `MLX ${clusterId}`;
    this.title.caption = `MLX cluster ${clusterId}: live dashboard`;
    this.title.closable = true;
    this.addClass('mlxj-dashboard');
    this.node.setAttribute('data-cluster', clusterId);
  }

  /** Fetch the cluster and redraw; an error is shown in place, not thrown. */
  async refresh(): Promise<void> {
    try {
      this.render(await getCluster(this.clusterId));
    } catch (error) {
      this.node.replaceChildren(el('h2', 'mlxj-dash-title', `MLX cluster ${this.clusterId}`),
        el('div', 'mlxj-dash-error', `cannot read ${this.clusterId}: ${(error as Error).message}`));
    }
  }

  private render(c: ICluster): void {
    const now = new Date();
    for (const r of c.ranks || []) {
      const h = this.memory.get(r.rank) || [];
      if (typeof r.memory === 'number') {
        h.push(r.memory);
        if (h.length > HISTORY) {
          h.shift();
        }
      }
      this.memory.set(r.rank, h);
    }
    const root = el('div', 'mlxj-dash-body');
    const head = el('div', 'mlxj-dash-head');
    head.appendChild(el('h2', 'mlxj-dash-title', `MLX cluster ${c.id}`));
    head.appendChild(el('span', `mlxj-pill mlxj-pill-${c.state}`, c.state));
    root.appendChild(head);
    const owner = c.owner === 'server' ? 'started from this panel' : `started by the kernel with pid ${c.owner_pid}`;
    root.appendChild(el('div', 'mlxj-dash-sub',
      `${c.backend} · ${c.ranks?.length || c.size} ranks · ${c.hosts.join(', ')} · ${owner}`));
    if (c.slurm) {
      const s = c.slurm;
      const nodes = Array.isArray(s.nodes) ? s.nodes.join(',') : s.nodes || '';
      const job = el('dl', 'mlxj-dash-slurm');
      for (const [k, v] of [['Slurm job', String(s.job_id)], ['state', s.state || '?'], ['nodes', nodes || '?'],
                            ['time left', s.time_left_text || '?']]) {
        job.appendChild(el('dt', '', k));
        job.appendChild(el('dd', `mlxj-dash-slurm-${k.replace(' ', '-')}`, v));
      }
      root.appendChild(job);
    }
    if (c.error) {
      root.appendChild(el('pre', 'mlxj-dash-error', c.error));
    }
    if (c.diagnosis) {
      root.appendChild(el('div', 'mlxj-dash-diagnosis', c.diagnosis));
    }
    if (c.ranks && c.ranks.length) {
      const table = el('table', 'mlxj-dash-ranks');
      const hr = el('tr');
      for (const name of ['rank', 'host', 'pid', 'health', 'state', 'memory', 'memory, last 5 min']) {
        hr.appendChild(el('th', '', name));
      }
      table.appendChild(hr);
      for (const r of c.ranks) {
        const tr = el('tr', `mlxj-health-${r.health || 'unknown'}`);
        tr.setAttribute('data-rank', String(r.rank));
        tr.appendChild(el('td', 'mlxj-dash-rank', String(r.rank)));
        tr.appendChild(el('td', 'mlxj-dash-host', r.host));
        tr.appendChild(el('td', 'mlxj-dash-pid', String(r.pid ?? '?')));
        tr.appendChild(el('td', 'mlxj-col-health', r.health || 'unknown'));
        tr.appendChild(el('td', 'mlxj-dash-state', doing(r)));
        tr.appendChild(el('td', 'mlxj-dash-memory', typeof r.memory === 'number' ? r.memory_text || '' : ''));
        const chart = el('td', 'mlxj-dash-chart');
        chart.appendChild(sparkline(this.memory.get(r.rank) || [], `rank ${r.rank} memory`));
        tr.appendChild(chart);
        table.appendChild(tr);
      }
      root.appendChild(table);
    } else if (c.state === 'starting') {
      root.appendChild(el('div', 'mlxj-dash-sub', `${c.connected ?? 0} ranks connected…`));
    }
    root.appendChild(el('div', 'mlxj-dash-updated', `updated ${now.toLocaleTimeString()} · every second while shown`));
    this.node.replaceChildren(root);
  }

  /** Refresh now and every second; called when it shows (a tab brought forward, or opened in a split, visible at once). */
  private start(): void {
    window.clearInterval(this.timer);
    void this.refresh();
    this.timer = window.setInterval(() => void this.refresh(), REFRESH_MS);
  }

  protected onAfterAttach(): void {
    if (this.isVisible) {
      this.start();
    }
  }

  protected onAfterShow(): void {
    this.start();
  }

  protected onAfterHide(): void {
    window.clearInterval(this.timer);
  }

  protected onBeforeDetach(): void {
    window.clearInterval(this.timer);
  }

  dispose(): void {
    window.clearInterval(this.timer);
    super.dispose();
  }

  private timer = 0;
  private memory = new Map<number, number[]>();
}
