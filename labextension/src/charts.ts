/** The dashboard's time charts (uPlot): one measure, a line per rank, with a time axis, round ticks, the
 * values under the cursor, drag to zoom; themed from JupyterLab's CSS variables. */
import uPlot from 'uplot';

/** A pause longer than this between two points breaks the line (nobody was looking meanwhile). */
const GAP_S = 3.5;
/** One colour per rank (Tableau 10: told apart in light and dark themes alike). */
const PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7',
  '#9c755f', '#bab0ac'];
const BINARY = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

/** Bytes in the server's words (mlx_jupyter.cluster.shared.units.format_bytes): 1023 B, 1.5 KiB, 50.0 MiB. */
export function formatBytes(n: number): string {
  let v = n;
  let i = 0;
  while (v >= 1024 && i < BINARY.length - 1) {
    v /= 1024;
    i += 1;
  }
  return i === 0 ? `${Math.round(v)} B` : `${v.toFixed(1)} ${BINARY[i]}`;
}

/** A rate per second, short: 0, 0.5, 12, 1.2k. */
export function formatRate(n: number): string {
  if (n >= 1000) {
    return `${(n / 1000).toFixed(1)}k`;
  }
  return n >= 10 || n === 0 ? String(Math.round(n)) : n.toFixed(1);
}

/** A round step (1, 2 or 5 times a power of ten) that cuts `span` into at most `most` parts. */
export function niceStep(span: number, most = 4): number {
  const raw = Math.max(span, 1e-12) / most;
  const power = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map(m => m * power).find(s => s >= raw) ?? 10 * power;
}

/** Ticks from 0 up to at least `top`: round in the unit of `base` that suits the top (bytes: KiB, MiB, GiB),
 * or plain decimals (`base` 1). Each with its label. */
export function ticks(top: number, binary: boolean, most = 4): { values: number[]; labels: string[] } {
  let unit = 1;
  let name = '';
  if (binary) {
    let i = 0;
    while (top / unit >= 1024 && i < BINARY.length - 1) {
      unit *= 1024;
      i += 1;
    }
    name = ` ${BINARY[i]}`;
  }
  const step = niceStep(top / unit, most);
  const digits = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  const values: number[] = [];
  const labels: string[] = [];
  for (let i = 0; ; i++) {
    const v = i * step;
    values.push(v * unit);
    labels.push(i === 0 ? '0' : `${v.toFixed(digits)}${name}`);
    if (v >= top / unit - 1e-9) {
      break;
    }
  }
  return { values, labels };
}

/** One line of a chart: its label and colour, its points, dashed or not. */
export interface ILine {
  label: string;
  rank: number;
  t: number[];
  values: (number | null)[];
  dash?: boolean;
}

export interface IChartSpec {
  /** What the chart shows ("CPU (% of a core)"); the class names its measure. */
  title: string;
  key: string;
  /** How a value reads (the legend, under the cursor) and whether its scale is in bytes. */
  format: (v: number) => string;
  binary: boolean;
  /** The scale's top is at least this (100 for CPU %). */
  floor: number;
  /** Cursors of charts with the same key move together. */
  sync: string;
  /** Told when the user zooms in by dragging (true) or out by a double click (false). */
  onZoom: (zoomed: boolean) => void;
}

/** The lines' points on one time axis (uPlot's aligned columns): a point a line lacks is skipped, a pause
 * longer than GAP_S breaks every line. */
export function align(lines: ILine[]): uPlot.AlignedData {
  const seen = new Set(lines.flatMap(l => l.t));
  const times = [...seen].sort((a, b) => a - b);
  const x: number[] = [];
  for (const t of times) {
    if (x.length && t - x[x.length - 1] > GAP_S) {
      x.push(x[x.length - 1] + GAP_S / 2);   // a break: null on every line
    }
    x.push(t);
  }
  const columns = lines.map(l => {
    const at = new Map(l.t.map((t, i) => [t, l.values[i]]));
    return x.map((t, i) => (!seen.has(t) ? null : at.has(t) ? at.get(t) ?? null : undefined));
  });
  return [x, ...columns] as uPlot.AlignedData;
}

function css(node: HTMLElement, name: string, fallback: string): string {
  return getComputedStyle(node).getPropertyValue(name).trim() || fallback;
}

function clock(t: number): string {
  return new Date(t * 1000).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
}

/** A uPlot chart of `spec` in `box`, sized to its width; lines as `setLines` gives them. */
export class TimeChart {
  constructor(readonly box: HTMLElement, readonly spec: IChartSpec, lines: ILine[], width: number) {
    this.signature = TimeChart.signature(lines);
    const ink = css(box, '--jp-ui-font-color1', '#222');
    const grid = css(box, '--jp-border-color2', '#ddd');
    const font = `11px ${css(box, '--jp-ui-font-family', 'sans-serif')}`;
    const axis = (values: uPlot.Axis['values'], size: number): uPlot.Axis => ({
      stroke: ink, font, size, values, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1, size: 4 }
    });
    const opts: uPlot.Options = {
      width: Math.max(width, 200),
      height: 150,
      cursor: { sync: { key: spec.sync }, drag: { x: true, y: false } },
      legend: { live: true },
      scales: {
        x: { time: true },
        y: { range: (_u, _min, max) => [0, this.top(max)] }
      },
      series: [
        { label: 'time', value: (_u, v) => (v === null ? '–' : clock(v)) },
        ...lines.map(l => ({
          label: l.label, stroke: PALETTE[l.rank % PALETTE.length], width: 1.5, dash: l.dash ? [5, 3] : undefined,
          // a dot only where a line has too few points to be drawn (a history a second old)
          points: { show: (_u: uPlot, _s: number, i0: number, i1: number) => i1 - i0 < 3 }, value: (_u: uPlot, v: number | null) => (v === null || v === undefined ? '–' : spec.format(v))
        }))
      ],
      axes: [
        axis((_u, splits) => splits.map(clock), 36),
        { ...axis((_u, splits) => splits.map(v => this.labels.get(v) ?? spec.format(v)), 64),
          splits: () => this.yTicks().values }
      ],
      hooks: {
        // away from the chart, the legend says the newest values (not a row of dashes)
        setCursor: [u => {
          if (u.cursor.idx === null || u.cursor.idx === undefined) {
            this.newestLegend();
          }
        }],
        setSelect: [u => {
          if (u.select.width > 0) {
            this.zoomed = true;
            spec.onZoom(true);
          }
        }]
      }
    };
    this.plot = new uPlot(opts, align(lines), box);
    this.plot.over.addEventListener('dblclick', () => {
      this.zoomed = false;
      spec.onZoom(false);
    });
  }

  /** The lines it draws, as a key: another set of lines needs another chart. */
  static signature(lines: ILine[]): string {
    return lines.map(l => l.label).join('|');
  }

  /** New points; the time axis shows [from, to] unless the user zoomed in. */
  update(lines: ILine[], from: number, to: number): void {
    this.peak = Math.max(0, ...lines.flatMap(l => l.values.filter((v): v is number => typeof v === 'number')));
    this.plot.setData(align(lines), false);
    if (!this.zoomed) {
      this.plot.setScale('x', { min: from, max: to });
    } else {
      this.plot.redraw(false, true);
    }
    if (this.plot.cursor.idx === null || this.plot.cursor.idx === undefined) {
      this.newestLegend();
    }
  }

  private newestLegend(): void {
    const n = this.plot.data[0].length;
    if (n) {
      this.plot.setLegend({ idx: n - 1 });
    }
  }

  /** Follow the window again (the "live" button). */
  unzoom(): void {
    this.zoomed = false;
  }

  resize(width: number): void {
    if (Math.abs(width - this.plot.width) > 1) {
      this.plot.setSize({ width: Math.max(width, 200), height: 150 });
    }
  }

  destroy(): void {
    this.plot.destroy();
  }

  /** The scale's top: the last tick at or above the highest value (or the floor). */
  private top(max: number | null): number {
    const t = this.yTicks(max ?? 0).values;
    return t[t.length - 1] || 1;
  }

  private yTicks(max = this.peak): { values: number[]; labels: string[] } {
    const t = ticks(Math.max(this.spec.floor, max, this.peak) || 1, this.spec.binary);
    this.labels = new Map(t.values.map((v, i) => [v, t.labels[i]]));
    return t;
  }

  readonly signature: string;
  readonly plot: uPlot;
  private zoomed = false;
  private peak = 0;
  private labels = new Map<number, string>();
}
