import type { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { IDashboard, IProfile, IRank, IRankSeries, getDashboard, slurmState } from './api';
import { formatBytes, formatRate, sparkline } from './charts';

/** The dashboard refreshes once a second while it is visible (and never while hidden). */
const REFRESH_MS = 1000;
/** The charts' window: the last five minutes (the server keeps as much, one point a second at most). */
const WINDOW_S = 300;
/** The charts' shortest span: a young history fills the width instead of a sliver at its right end. */
const MIN_SPAN_S = 60;

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

/** What a rank is doing, in words: the where model's line when there is one, else its state or health. */
function doing(r: IRank): string {
  return r.where || r.state || r.health || 'unknown';
}

/** The charted measures: the column's name, the series' key, the scale's floor, how a value reads. */
const MEASURES: [string, keyof Omit<IRankSeries, 't'>, number, (v: number) => string][] = [
  ['CPU', 'cpu', 100, v => `${Math.round(v)}%`],
  ['memory', 'memory', 0, formatBytes],
  ['collectives/s', 'ops', 1, formatRate],
  ['bytes/s', 'bytes', 1024, v => formatBytes(v)]
];

/** A cluster's live dashboard, in a main-area tab: its ranks, where each one is, their CPU, memory and
 * collectives over the last minutes, its Slurm job and its last profile. */
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

  /** Fetch the cluster (the points since the last one) and redraw; an error is shown in place, not thrown. */
  async refresh(): Promise<void> {
    if (this.busy) {
      return;   // the last answer is still on its way (a slow server): no second request behind it
    }
    this.busy = true;
    try {
      this.render(await getDashboard(this.clusterId, this.newest));
    } catch (error) {
      const gone = (error as { response?: Response }).response?.status === 404;
      if (gone) {   // stopped (here or by its kernel): nothing more to ask for until it is opened again
        window.clearInterval(this.timer);
      }
      this.node.replaceChildren(el('h2', 'mlxj-dash-title', `MLX cluster ${this.clusterId}`),
        el('div', 'mlxj-dash-error', gone ? `${this.clusterId} is gone: it was stopped, or its kernel ended.`
          : `cannot read ${this.clusterId}: ${(error as Error).message}`));
    } finally {
      this.busy = false;
    }
  }

  /** Add the new points to each rank's series and drop those older than the window. */
  private merge(d: IDashboard): void {
    if (!d.series) {
      return;
    }
    const present = new Set(Object.keys(d.series.ranks));
    for (const key of [...this.series.keys()]) {
      if (!present.has(key)) {
        this.series.delete(key);
      }
    }
    for (const [rank, add] of Object.entries(d.series.ranks)) {
      const s = this.series.get(rank) || { t: [], cpu: [], memory: [], ops: [], bytes: [] };
      const from = add.t.findIndex(t => t > this.newest);   // an answer that crossed a refresh repeats none
      if (from >= 0) {
        for (const k of ['t', 'cpu', 'memory', 'ops', 'bytes'] as const) {
          (s[k] as (number | null)[]).push(...add[k].slice(from));
        }
      }
      this.series.set(rank, s);
    }
    let newest = this.newest;
    for (const s of this.series.values()) {
      newest = Math.max(newest, s.t[s.t.length - 1] ?? 0);
    }
    for (const s of this.series.values()) {
      const keep = s.t.findIndex(t => t >= newest - WINDOW_S);
      if (keep > 0) {
        for (const k of ['t', 'cpu', 'memory', 'ops', 'bytes'] as const) {
          s[k].splice(0, keep);
        }
      }
    }
    this.newest = newest;
  }

  private render(c: IDashboard): void {
    this.merge(c);
    const root = el('div', 'mlxj-dash-body');
    const head = el('div', 'mlxj-dash-head');
    head.appendChild(el('h2', 'mlxj-dash-title', `MLX cluster ${c.id}`));
    head.appendChild(el('span', `mlxj-pill mlxj-pill-${c.state}`, c.state));
    root.appendChild(head);
    const owner = c.owner_text || (c.owner === 'server' ? 'started from this panel' : `started by kernel pid ${c.owner_pid}`);
    root.appendChild(el('div', 'mlxj-dash-sub',
      `${c.backend} · ${c.ranks?.length || c.size} ranks · ${c.hosts.join(', ')} · ${owner}`));
    if (c.slurm) {
      const s = c.slurm;
      const nodes = Array.isArray(s.nodes) ? s.nodes.join(',') : s.nodes || '';
      const job = el('dl', 'mlxj-dash-slurm');
      // the state word (with a pending job's reason): its nodes have their own row
      const state = slurmState(s, '') || '?';
      for (const [k, v] of [['Slurm job', String(s.job_id)], ['state', state], ['nodes', nodes || '?'],
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
    if (c.restart_report) {
      root.appendChild(el('div', 'mlxj-dash-restart', `last restart: ${c.restart_report.replace(/^restart: /, '')}`));
    }
    if (c.ranks && c.ranks.length) {
      root.appendChild(this.rankTable(c));
      if (c.series) {
        const span = this.span();
        root.appendChild(el('h3', 'mlxj-dash-h3',
          span >= WINDOW_S ? `The last ${WINDOW_S / 60} minutes` : `The last ${Math.round(span)} s (up to ${WINDOW_S / 60} minutes)`));
        root.appendChild(this.charts(c));
      }
      root.appendChild(el('div', 'mlxj-dash-note', c.series
        ? 'A point a second while this tab or the panel is shown. '
          + 'Collectives are the ops of our core\'s groups (group, mlx_jupyter.distributed; MLX\'s own '
          + 'mx.distributed calls are not counted); bytes/s is their count times the last op\'s size.'
        : 'No charts: the server reads the live state only of clusters started from this panel '
          + '(this one belongs to a kernel; %mlx_cluster status and where show its ranks there).'));
    } else if (c.state === 'starting') {
      root.appendChild(el('div', 'mlxj-dash-sub', `${c.connected ?? 0} ranks connected…`));
    }
    root.appendChild(this.profileSection(c.profile));
    root.appendChild(el('div', 'mlxj-dash-updated', `updated ${new Date().toLocaleTimeString()} · every second while shown`));
    this.node.replaceChildren(root);
  }

  private rankTable(c: IDashboard): HTMLTableElement {
    const restarted = c.ranks.some(r => r.restart);
    const table = el('table', 'mlxj-dash-ranks');
    const hr = el('tr');
    const names = ['rank', 'host', 'pid', 'health', 'state', ...(restarted ? ['names from'] : []), 'memory'];
    for (const name of names) {
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
      if (restarted) {
        tr.appendChild(el('td', 'mlxj-dash-restart-origin', r.restart || ''));
      }
      const memory = el('td', 'mlxj-dash-memory');
      memory.appendChild(el('span', 'mlxj-dash-value', typeof r.memory === 'number' ? r.memory_text || '' : ''));
      tr.appendChild(memory);
      table.appendChild(tr);
    }
    return table;
  }

  /** Per rank, a small chart of each measure over the last minutes, with its last value. */
  private charts(c: IDashboard): HTMLElement {
    const grid = el('div', 'mlxj-dash-charts');
    grid.style.gridTemplateColumns = `max-content repeat(${MEASURES.length}, minmax(96px, 1fr))`;
    grid.appendChild(el('div', 'mlxj-dash-charts-head', ''));
    for (const [name] of MEASURES) {
      grid.appendChild(el('div', 'mlxj-dash-charts-head', name));
    }
    for (const r of c.ranks) {
      grid.appendChild(el('div', 'mlxj-dash-charts-rank', `rank ${r.rank}`));
      const s = this.series.get(String(r.rank)) || { t: [], cpu: [], memory: [], ops: [], bytes: [] };
      for (const [name, key, floor, format] of MEASURES) {
        const cell = this.chartCell(r, s, name, key, floor, format);
        cell.setAttribute('data-rank', String(r.rank));
        grid.appendChild(cell);
      }
    }
    return grid;
  }

  /** One measure of one rank: its last value and its chart. */
  private chartCell(r: IRank, s: IRankSeries, name: string, key: keyof Omit<IRankSeries, 't'>, floor: number,
                    format: (v: number) => string): HTMLElement {
    const td = el('div', `mlxj-dash-chart mlxj-dash-chart-${key}`);
    const values = s[key];
    let last: number | null = null;
    for (let i = values.length - 1; i >= 0 && last === null; i--) {
      last = values[i];
    }
    // memory: the status row's own figure when the series has none yet (the server's words for it)
    const text = last !== null ? format(last) : key === 'memory' && typeof r.memory === 'number' ? r.memory_text || '' : '–';
    td.title = `rank ${r.rank} ${name}`;
    td.setAttribute('data-points', String(values.filter(v => v !== null).length));
    td.setAttribute('data-last', last === null ? '' : String(last));
    td.setAttribute('data-newest', String(s.t[s.t.length - 1] ?? ''));
    td.setAttribute('data-peak', String(Math.max(0, ...values.filter((v): v is number => v !== null))));
    const value = el('span', 'mlxj-dash-value', key === 'memory' ? text : `${text}${key === 'bytes' && last !== null ? '/s' : ''}`);
    td.appendChild(value);
    td.appendChild(sparkline(s.t, values, { window: this.span(), now: this.newest, floor, format,
                                            title: `rank ${r.rank} ${name}` }));
    return td;
  }

  /** The cluster's last --profile timeline, drawn once per profile (an image: the SVG runs nothing). */
  private profileSection(p: IProfile | null): HTMLElement {
    if (this.profileNode && this.profileTime === (p ? p.time : 0)) {
      return this.profileNode;
    }
    const box = el('section', 'mlxj-dash-profile');
    if (!p) {
      box.appendChild(el('h3', 'mlxj-dash-h3', 'Last profile'));
      box.appendChild(el('div', 'mlxj-dash-note',
        'None recorded yet: run a cell with %%mlx_distributed --profile on this cluster.'));
    } else {
      box.setAttribute('data-profile-time', String(p.time));
      box.appendChild(el('h3', 'mlxj-dash-h3',
        `Last profile: ${new Date(p.time * 1000).toLocaleTimeString()}, ranks ${p.ranks.join(', ')}`));
      if (p.svg) {
        const img = el('img', 'mlxj-dash-profile-img');
        img.alt = `the op timeline of the last profiled cell, one lane per rank`;
        img.src = `data:image/svg+xml;charset=utf-8,${encodeURIComponent(p.svg)}`;
        box.appendChild(img);
      } else if (p.svg_dropped) {
        box.appendChild(el('div', 'mlxj-dash-note', 'The timeline is too large to keep here: see it under its cell.'));
      }
      box.appendChild(el('pre', 'mlxj-dash-profile-summary', p.summary));
    }
    this.profileNode = box;
    this.profileTime = p ? p.time : 0;
    return box;
  }

  /** The charts' time span: the history's age, between MIN_SPAN_S and WINDOW_S. */
  private span(): number {
    let oldest = this.newest;
    for (const s of this.series.values()) {
      oldest = Math.min(oldest, s.t[0] ?? oldest);
    }
    return Math.min(WINDOW_S, Math.max(MIN_SPAN_S, this.newest - oldest));
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

  /** A closed tab is done with: disposed, so the card's Dashboard opens a new one. */
  protected onCloseRequest(msg: Message): void {
    super.onCloseRequest(msg);
    this.dispose();
  }

  protected onBeforeDetach(): void {
    window.clearInterval(this.timer);
  }

  dispose(): void {
    window.clearInterval(this.timer);
    super.dispose();
  }

  private timer = 0;
  private busy = false;
  /** The newest point's time (the server's clock): the next request asks for the points after it. */
  private newest = 0;
  private series = new Map<string, IRankSeries>();
  private profileNode: HTMLElement | null = null;
  private profileTime = -1;
}
