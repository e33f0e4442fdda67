import type { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { IDashboard, IProfile, IRankSeries, SERIES_KEYS, getDashboard, slurmState } from './api';
import { ChartPanel, WINDOWS } from './chartpanel';
import { healthSummary } from './cardparts';
import { rankTable } from './ranktable';

/** The dashboard refreshes once a second while it is visible (and never while hidden). */
const REFRESH_MS = 1000;
/** The points kept: the widest window offered (the server keeps as much, one point a second at most). */
const KEEP_S = Math.max(...WINDOWS.map(w => w[1]));

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

const emptySeries = (): IRankSeries => ({ t: [], cpu: [], memory: [], ops: [], bytes: [], mlx_active: [], mlx_peak: [],
  mlx_cache: [], mlx_ops: [], mlx_bytes: [] });

/** A cluster's live dashboard, in a main-area tab: its ranks, where each one is, their CPU, memory (RSS and
 * MLX's own) and collectives over time, its Slurm job and its last profile. */
export class ClusterDashboard extends Widget {
  constructor(readonly clusterId: string) {
    super();
    this.id = `mlx-jupyter-dashboard-${clusterId}`;
    this.title.label = `MLX ${clusterId}`;
    this.title.caption = `MLX cluster ${clusterId}: live dashboard`;
    this.title.closable = true;
    this.addClass('mlxj-dashboard');
    this.node.setAttribute('data-cluster', clusterId);
    this.charts = new ChartPanel(`mlxj-${clusterId}`);
    // parts that stay put between refreshes: the charts keep their canvas, hover and zoom
    this.top = el('div', 'mlxj-dash-body');
    this.chartsNote = el('div', 'mlxj-dash-note', 'A point a second while this tab or the panel is shown. '
      + 'Collectives: a solid line per rank for the ops of mlx_jupyter (our core\'s groups: group, '
      + 'mlx_jupyter.distributed; bytes/s is their count times the last op\'s size), a dashed one for MLX\'s own '
      + 'mx.distributed calls on every MLX group (world and its splits; bytes/s: their inputs\' bytes). MLX memory: '
      + 'mx.get_active_memory() and mx.get_cache_memory() on ranks that imported MLX.');
    this.profileBox = el('div', 'mlxj-dash-profile-box');
    this.updated = el('div', 'mlxj-dash-updated');
    this.node.append(this.top, this.charts.node, this.chartsNote, this.profileBox, this.updated);
    this.showCharts(false);
  }

  private showCharts(on: boolean): void {
    this.charts.node.hidden = !on;
    this.chartsNote.hidden = !on;
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
      this.showCharts(false);
      this.top.replaceChildren(el('h2', 'mlxj-dash-title', `MLX cluster ${this.clusterId}`),
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
      const s = this.series.get(rank) || emptySeries();
      const from = add.t.findIndex(t => t > this.newest);   // an answer that crossed a refresh repeats none
      if (from >= 0) {
        for (const k of SERIES_KEYS) {
          (s[k] as (number | null)[]).push(...(add[k] || add.t.map(() => null)).slice(from));
        }
      }
      this.series.set(rank, s);
    }
    let newest = this.newest;
    for (const s of this.series.values()) {
      newest = Math.max(newest, s.t[s.t.length - 1] ?? 0);
    }
    for (const s of this.series.values()) {
      const keep = s.t.findIndex(t => t >= newest - KEEP_S);
      if (keep > 0) {
        for (const k of SERIES_KEYS) {
          s[k].splice(0, keep);
        }
      }
    }
    this.newest = newest;
  }

  private render(c: IDashboard): void {
    this.merge(c);
    const root = document.createDocumentFragment();
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
    if (c.story && c.ranks && c.ranks.length) {   // the server's words, the card's too
      root.appendChild(el('div', 'mlxj-dash-story', healthSummary(c.ranks, c.story)));
    }
    if (c.diagnosis) {   // the server says it only for a rank that has stalled (no progress for 2 s)
      root.appendChild(el('div', 'mlxj-dash-diagnosis', c.diagnosis));
    }
    if (c.restart_report) {
      root.appendChild(el('div', 'mlxj-dash-restart', `last restart: ${c.restart_report.replace(/^restart: /, '')}`));
    }
    if (c.ranks && c.ranks.length && c.state !== 'starting') {
      root.appendChild(rankTable(c.ranks));
    } else if (c.state === 'starting') {
      root.appendChild(el('div', 'mlxj-dash-sub', `starting: ${c.connected ?? 0} of ${c.size} ranks connected…`));
    }
    const live = !!(c.ranks && c.ranks.length && c.series && this.series.size);
    if (!live && c.ranks && c.ranks.length && c.state !== 'starting') {
      root.appendChild(el('div', 'mlxj-dash-note mlxj-dash-waiting-charts', 'Charts: waiting for the ranks\' first samples…'));
    }
    this.top.replaceChildren(root);
    this.showCharts(live);
    if (live) {
      this.charts.update(this.series, this.newest);
    }
    const profile = this.profileSection(c.profile);
    if (this.profileBox.firstChild !== profile) {
      this.profileBox.replaceChildren(profile);
    }
    this.updated.textContent = `updated ${new Date().toLocaleTimeString()} · every second while shown`;
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
    this.charts.dispose();
    super.dispose();
  }

  private charts: ChartPanel;
  private top: HTMLElement;
  private chartsNote: HTMLElement;
  private profileBox: HTMLElement;
  private updated: HTMLElement;
  private timer = 0;
  private busy = false;
  /** The newest point's time (the server's clock): the next request asks for the points after it. */
  private newest = 0;
  private series = new Map<string, IRankSeries>();
  private profileNode: HTMLElement | null = null;
  private profileTime = -1;
}
