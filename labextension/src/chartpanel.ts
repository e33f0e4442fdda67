/** The dashboard's charts: a chart per measure with a line per rank, a choice of time window, and a way back
 * to the live window after zooming in. Made once per tab; fed each refresh's series. */
import { IRankSeries } from './api';
import { IChartSpec, ILine, TimeChart, formatBytes, formatRate } from './charts';

/** The windows offered, in seconds (the server keeps the last 15 minutes). */
export const WINDOWS: [string, number][] = [['1 min', 60], ['5 min', 300], ['15 min', 900]];
/** The shortest span shown: a young history fills the width instead of a sliver at its right end. */
const MIN_SPAN_S = 30;

type Key = keyof Omit<IRankSeries, 't'>;

/** A chart's measure: its title, its lines (a key per line, its label after the rank's, dashed or not; a line after
 * the first only where some rank has values for it), how values read. */
interface IMeasure {
  key: string;
  title: string;
  lines: [Key, string, boolean][];
  format: (v: number) => string;
  binary: boolean;
  floor: number;
}

const MEASURES: IMeasure[] = [
  { key: 'cpu', title: 'CPU (% of a core)', lines: [['cpu', '', false]], format: v => `${Math.round(v)}%`, binary: false, floor: 100 },
  { key: 'memory', title: 'Memory (RSS)', lines: [['memory', '', false]], format: formatBytes, binary: true, floor: 0 },
  { key: 'mlx', title: 'MLX memory (active, cache dashed)', lines: [['mlx_active', ' active', false], ['mlx_cache', ' cache', true]],
    format: formatBytes, binary: true, floor: 0 },
  { key: 'ops', title: 'Collectives per second (MLX\'s own dashed)', lines: [['ops', ' mlx_jupyter', false], ['mlx_ops', ' mx.distributed', true]],
    format: formatRate, binary: false, floor: 1 },
  { key: 'bytes', title: 'Bytes per second (MLX\'s own dashed)', lines: [['bytes', ' mlx_jupyter', false], ['mlx_bytes', ' mx.distributed', true]],
    format: v => `${formatBytes(v)}/s`, binary: true, floor: 1024 }
];

function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls = '', text?: string): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = cls;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** The charts of one cluster. */
export class ChartPanel {
  constructor(readonly sync: string) {
    this.node = el('section', 'mlxj-dash-charts-section');
    const bar = el('div', 'mlxj-dash-charts-bar');
    this.heading = el('h3', 'mlxj-dash-h3');
    bar.appendChild(this.heading);
    const choice = el('div', 'mlxj-dash-window');
    choice.setAttribute('role', 'group');
    choice.setAttribute('aria-label', 'time window');
    for (const [label, seconds] of WINDOWS) {
      const b = el('button', 'jp-mod-styled mlxj-dash-window-choice', label);
      b.dataset.seconds = String(seconds);
      b.addEventListener('click', () => {
        this.window = seconds;
        this.unzoom();
      });
      choice.appendChild(b);
    }
    this.live = el('button', 'jp-mod-styled mlxj-dash-live', 'Back to live');
    this.live.title = 'follow the window again (or double-click a chart)';
    this.live.addEventListener('click', () => this.unzoom());
    choice.appendChild(this.live);
    bar.appendChild(choice);
    this.node.appendChild(bar);
    this.grid = el('div', 'mlxj-dash-charts');
    this.node.appendChild(this.grid);
    this.node.appendChild(el('div', 'mlxj-dash-note',
      'Hover a chart for the values at that time; drag across it to zoom in, double-click to zoom out.'));
    this.resizer = new ResizeObserver(() => this.resize());
    this.resizer.observe(this.grid);
  }

  /** Draw the series (rank -> columns) up to `newest` (the server's clock) in the chosen window. */
  update(series: Map<string, IRankSeries>, newest: number): void {
    const theme = document.body.dataset.jpThemeName || '';
    if (theme !== this.theme) {   // canvas colours are read once: a new theme needs new charts
      this.clear();
      this.theme = theme;
    }
    const oldest = Math.min(newest, ...[...series.values()].map(s => s.t[0] ?? newest));
    const span = Math.min(this.window, Math.max(MIN_SPAN_S, newest - oldest));
    this.heading.textContent = span >= this.window ? `The last ${this.window / 60} min`
      : `The last ${Math.round(span)} s (window ${this.window / 60} min)`;
    for (const b of Array.from(this.node.querySelectorAll<HTMLButtonElement>('.mlxj-dash-window-choice'))) {
      b.classList.toggle('mlxj-selected', Number(b.dataset.seconds) === this.window);
      b.setAttribute('aria-pressed', String(Number(b.dataset.seconds) === this.window));
    }
    this.live.hidden = !this.zoomed;
    for (const m of MEASURES) {
      const lines = this.lines(m, series);
      const has = lines.some(l => l.values.some(v => v !== null));
      if (m.key === 'mlx' && !has) {   // no rank has imported MLX: no empty chart
        this.drop(m.key);
        continue;
      }
      let chart = this.charts.get(m.key);
      if (chart && chart.signature !== TimeChart.signature(lines)) {
        this.drop(m.key);
        chart = undefined;
      }
      if (!chart) {
        chart = this.make(m, lines);
      }
      chart.update(lines, newest - span, newest);
      this.describe(chart.box.parentElement as HTMLElement, m, series, newest);
    }
  }

  private lines(m: IMeasure, series: Map<string, IRankSeries>): ILine[] {
    const out: ILine[] = [];
    const ranks = [...series.entries()].sort((a, b) => Number(a[0]) - Number(b[0]));
    const shown = m.lines.filter(([key], i) => i === 0 || ranks.some(([, s]) => (s[key] || []).some(v => v !== null)));
    for (const [rank, s] of ranks) {
      for (const [key, suffix, dash] of shown) {
        out.push({ label: `rank ${rank}${suffix}`, rank: Number(rank), t: s.t, values: s[key] || [], dash });
      }
    }
    return out;
  }

  private make(m: IMeasure, lines: ILine[]): TimeChart {
    const box = el('div', `mlxj-dash-chart mlxj-dash-chart-${m.key}`);
    box.appendChild(el('div', 'mlxj-dash-chart-title', m.title));
    const plot = el('div', 'mlxj-dash-plot');
    box.appendChild(plot);
    const at = MEASURES.filter(x => this.charts.has(x.key) || x.key === m.key).findIndex(x => x.key === m.key);
    this.grid.insertBefore(box, this.grid.children[at] || null);
    const spec: IChartSpec = { title: m.title, key: m.key, format: m.format, binary: m.binary, floor: m.floor,
      sync: this.sync, onZoom: zoomed => {
        this.zoomed = zoomed;
        this.live.hidden = !zoomed;
      } };
    const chart = new TimeChart(plot, spec, lines, plot.clientWidth || 360);
    this.charts.set(m.key, chart);
    return chart;
  }

  /** What the browser tests and screen readers read: per rank and line, its points, last value and peak (the first
   * line's as `points0`, `last0`, `peak0`; another's after its key: `mlxOpsLast0`). */
  private describe(box: HTMLElement, m: IMeasure, series: Map<string, IRankSeries>, newest: number): void {
    box.dataset.newest = String(newest);
    const said: string[] = [];
    for (const [rank, s] of series) {
      m.lines.forEach(([key, suffix], i) => {
        const values = (s[key] || []).filter((v): v is number => typeof v === 'number');
        const name = (what: string): string => (i === 0 ? `${what}${rank}`
          : `${key.replace(/_(\w)/g, (_m, c: string) => c.toUpperCase())}${what[0].toUpperCase()}${what.slice(1)}${rank}`);
        box.dataset[name('points')] = String(values.length);
        box.dataset[name('last')] = values.length ? String(values[values.length - 1]) : '';
        box.dataset[name('peak')] = String(Math.max(0, ...values));
        if (values.length) {
          said.push(`rank ${rank}${suffix} ${m.format(values[values.length - 1])}`);
        }
      });
    }
    box.setAttribute('aria-label', `${m.title}: ${said.join(', ') || 'no points yet'}`);
  }

  private unzoom(): void {
    this.zoomed = false;
    for (const c of this.charts.values()) {
      c.unzoom();
    }
    this.live.hidden = true;
  }

  private resize(): void {
    for (const c of this.charts.values()) {
      c.resize(c.box.clientWidth);
    }
  }

  private drop(key: string): void {
    const chart = this.charts.get(key);
    if (chart) {
      chart.destroy();
      chart.box.parentElement?.remove();
      this.charts.delete(key);
    }
  }

  private clear(): void {
    for (const key of [...this.charts.keys()]) {
      this.drop(key);
    }
  }

  dispose(): void {
    this.resizer.disconnect();
    this.clear();
  }

  readonly node: HTMLElement;
  private heading: HTMLElement;
  private grid: HTMLElement;
  private live: HTMLButtonElement;
  private resizer: ResizeObserver;
  private charts = new Map<string, TimeChart>();
  private window = 300;
  private zoomed = false;
  private theme = '';
}
