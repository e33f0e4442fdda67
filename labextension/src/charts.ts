/** Small SVG charts for the dashboard: a rank's last minutes of one measure, themed by JupyterLab's CSS variables. */

const NS = 'http://www.w3.org/2000/svg';
/** A pause longer than this between two points breaks the line (nobody was looking meanwhile). */
const GAP_S = 3.5;

/** Bytes in the server's words (mlx_jupyter.cluster.cells.text.format_bytes): 1023 B, 1.5 KiB, 50.0 MiB. */
export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return i === 0 ? `${Math.round(v)} B` : `${v.toFixed(1)} ${units[i]}`;
}

/** A rate per second, short: 0, 0.5, 12, 1.2k. */
export function formatRate(n: number): string {
  if (n >= 1000) {
    return `${(n / 1000).toFixed(1)}k`;
  }
  return n >= 10 || n === 0 ? String(Math.round(n)) : n.toFixed(1);
}

export interface IChartOptions {
  /** The window shown, in seconds, ending at `now`. */
  window: number;
  /** The newest time of the cluster's points (the server's clock). */
  now: number;
  /** The scale's top is at least this (100 for CPU %); else the values' own maximum. */
  floor?: number;
  /** What the tooltip calls it, and how a value reads. */
  title: string;
  format: (v: number) => string;
  width?: number;
  height?: number;
}

/** A line of `values` at times `t` (oldest first) over the last `window` s, with a faint area under it;
 * null values and pauses longer than a few seconds break the line. */
export function sparkline(t: number[], values: (number | null)[], o: IChartOptions): SVGSVGElement {
  const w = o.width ?? 120;
  const h = o.height ?? 26;
  const svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('class', 'mlxj-chart');
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svg.setAttribute('preserveAspectRatio', 'none');   // stretched to its cell's width; strokes keep their width (CSS)
  svg.setAttribute('height', String(h));
  const known = values.filter((v): v is number => typeof v === 'number');
  const peak = known.length ? Math.max(...known) : 0;
  const top = Math.max(o.floor ?? 0, peak) || 1;
  const title = document.createElementNS(NS, 'title');
  title.textContent = known.length
    ? `${o.title}: now ${o.format(known[known.length - 1])}, peak ${o.format(peak)} over the last ${Math.round(o.window)} s`
    : `${o.title}: no points yet`;
  svg.appendChild(title);
  const base = document.createElementNS(NS, 'line');
  base.setAttribute('class', 'mlxj-chart-base');
  base.setAttribute('x1', '0');
  base.setAttribute('x2', String(w));
  base.setAttribute('y1', String(h - 0.5));
  base.setAttribute('y2', String(h - 0.5));
  svg.appendChild(base);
  const x = (ti: number) => w - ((o.now - ti) / o.window) * w;
  const y = (v: number) => h - 1.5 - (v / top) * (h - 4);
  // runs of consecutive points, each drawn as one line and one area
  const runs: [number, number][][] = [];
  let run: [number, number][] = [];
  for (let i = 0; i < t.length; i++) {
    const v = values[i];
    const gap = i > 0 && t[i] - t[i - 1] > GAP_S;
    if (typeof v !== 'number' || gap || x(t[i]) < 0) {
      if (run.length) {
        runs.push(run);
      }
      run = [];
      if (typeof v !== 'number' || x(t[i]) < 0) {
        continue;
      }
    }
    run.push([x(t[i]), y(v)]);
  }
  if (run.length) {
    runs.push(run);
  }
  for (const r of runs) {
    const pts = r.length === 1 ? [[r[0][0] - 1, r[0][1]], r[0]] : r;
    const line = pts.map(([a, b]) => `${a.toFixed(1)},${b.toFixed(1)}`).join(' ');
    const area = document.createElementNS(NS, 'polygon');
    area.setAttribute('class', 'mlxj-chart-area');
    area.setAttribute('points', `${pts[0][0].toFixed(1)},${h} ${line} ${pts[pts.length - 1][0].toFixed(1)},${h}`);
    svg.appendChild(area);
    const poly = document.createElementNS(NS, 'polyline');
    poly.setAttribute('class', 'mlxj-chart-line');
    poly.setAttribute('points', line);
    svg.appendChild(poly);
  }
  return svg;
}
