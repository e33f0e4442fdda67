import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** One rank of a cluster, as the server reports it. */
export interface IRank {
  rank: number;
  host: string;
  pid: number | null;
  state?: string;
  health?: string;
  memory?: number | null;
  memory_text?: string;
  /** Where the rank is: `idle`, `running line 3: …`, `in all_sum at line 4 waiting on rank 1`. */
  where?: string;
  /** Where its names came from at the cluster's last restart ("its own names", "from rank 0 (3 names)"). */
  restart?: string;
  /** MLX's own memory in bytes (mx.get_active_memory() and friends), for a rank that imported MLX. */
  mlx_memory?: { active?: number; peak?: number; cache?: number } | null;
  /** "owner": a rank on another host, its health as the owning process last wrote it (the server cannot look). */
  health_from?: string;
}

/** One rank's recent points, as columns: time (s since the epoch), CPU %, RSS bytes, our core's ops/s and bytes/s,
 * MLX's active, peak and cache bytes, MLX's own collectives (mx.distributed) per second and their bytes per second
 * (mlx_jupyter.server.history.COLUMNS). */
export interface IRankSeries {
  t: number[];
  cpu: (number | null)[];
  memory: (number | null)[];
  ops: (number | null)[];
  bytes: (number | null)[];
  mlx_active: (number | null)[];
  mlx_peak: (number | null)[];
  mlx_cache: (number | null)[];
  mlx_ops: (number | null)[];
  mlx_bytes: (number | null)[];
}

/** The series' columns, time first. */
export const SERIES_KEYS = ['t', 'cpu', 'memory', 'ops', 'bytes', 'mlx_active', 'mlx_peak', 'mlx_cache', 'mlx_ops',
  'mlx_bytes'] as const;

/** A cluster's last `--profile` timeline, as the notebook that ran it kept it. */
export interface IProfile {
  time: number;
  ranks: number[];
  summary: string;
  svg: string;
  svg_dropped?: boolean;
}

/** The dashboard's view of one cluster: as listed, plus its ranks' series and last profile. */
export interface IDashboard extends ICluster {
  /** Every cluster's, whoever started it (a kernel's once the server is connected to its controller). */
  series: { window: number; ranks: Record<string, IRankSeries> } | null;
  profile: IProfile | null;
}

/** One field of the start form, from the server's schema (mlx_jupyter.server.requests.form_fields). */
export interface IFormField {
  name: string;
  label: string;
  kind: 'number' | 'text' | 'choice';
  placeholder: string;
  help: string;
  min?: number;
  max?: number;
  default?: number;
  maxLength?: number;
  choices?: string[];
  /** a field not to be given with this one, and the words that say so */
  excludes?: string;
  excludes_why?: string;
}

/** One cluster: started by this server (owner "server") or by a kernel. */
export interface ICluster {
  id: string;
  owner: string;
  owner_pid: number;
  backend: string;
  hosts: string[];
  size: number;
  state: string;
  error?: string;
  connected?: number;
  ranks: IRank[];
  /** One line when a rank has stalled (who waits for whom), in the words of the cell's own table. */
  diagnosis?: string;
  /** What the ranks do, and MLX's `world` shut down with how to restart: the server's words (server/live.py story). */
  story?: string;
  /** Whose it is, in words: "started from this panel", "started by x.ipynb (kernel pid N)", "another …". */
  owner_text?: string;
  /** "notebook": a kernel of this server; "other": another process (shown apart in the panel). */
  owner_kind?: string;
  /** The last restart's one line (what came back, and from where). */
  restart_report?: string;
  /** The Slurm job the ranks run in, as squeue shows it now. */
  slurm?: ISlurmJob;
}

/** A Slurm job as squeue shows it: its state word (RUNNING, PENDING...), a pending job's reason, nodes, time left. */
export interface ISlurmJob {
  job_id: number;
  state?: string;
  reason?: string;
  nodes?: string | string[];
  time_left_text?: string;
}

/** "RUNNING on node[1-2]", "PENDING (Resources)": the job's state word with its reason or its nodes, once. */
export function slurmState(s: ISlurmJob, nodes: string): string {
  if (s.reason) {
    return `${s.state || '?'} (${s.reason})`;
  }
  return [s.state || '', nodes ? `on ${nodes}` : ''].filter(p => p).join(' ');
}

/** Call the server extension's REST API under <base_url>/mlx-jupyter/. */
export async function requestAPI<T>(endPoint = '', init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'mlx-jupyter', endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: any = text;
  try {
    data = text.length ? JSON.parse(text) : {};
  } catch {
    // not JSON: keep the text for the error message
  }
  if (!response.ok) {
    const error = new ServerConnection.ResponseError(response, (data && data.error) || response.statusText);
    // a refused start names the form's field at fault: the panel shows the message under it
    (error as { field?: string }).field = data && typeof data.field === 'string' ? data.field : '';
    throw error;
  }
  return data as T;
}

export const listClusters = async (): Promise<ICluster[]> =>
  (await requestAPI<{ clusters: ICluster[] }>('clusters')).clusters;

export const startCluster = (n: number, hosts: string, backend: string, hostfile = ''): Promise<{ id: string }> =>
  requestAPI('clusters', {
    method: 'POST',
    body: JSON.stringify({ n, hosts: hostfile ? null : hosts || null, hostfile: hostfile || null, backend })
  });

/** The backends the server can start a cluster with (one list, served by mlx_jupyter.hostfile.BACKENDS). */
export const listBackends = async (): Promise<string[]> =>
  (await requestAPI<{ backends: string[] }>('backends')).backends;

export const stopCluster = (id: string): Promise<unknown> =>
  requestAPI(`clusters/${encodeURIComponent(id)}`, { method: 'DELETE' });

/** Restart a cluster this server started, keeping its ranks' names; the one-line report. */
export const restartCluster = async (id: string): Promise<string> =>
  (await requestAPI<{ report: string }>(`clusters/${encodeURIComponent(id)}/restart`, { method: 'POST' })).report;

export const connectCode = async (id: string): Promise<string> =>
  (await requestAPI<{ code: string }>(`clusters/${encodeURIComponent(id)}/connect`)).code;

/** One cluster, as the list shows it (ranks, where each is, its Slurm job). */
export const getCluster = (id: string): Promise<ICluster> => requestAPI<ICluster>(`clusters/${encodeURIComponent(id)}`);

/** One cluster for its dashboard: the points after `since` (all of the last minutes when 0) and its last profile. */
export const getDashboard = (id: string, since = 0): Promise<IDashboard> =>
  requestAPI<IDashboard>(`clusters/${encodeURIComponent(id)}/dashboard${since ? `?since=${since}` : ''}`);

/** The start form's fields, from the schema the server checks a start request against. */
export const getFormFields = async (): Promise<IFormField[]> =>
  (await requestAPI<{ fields: IFormField[] }>('schema')).fields;

/** A request the server refused names the field at fault ({"error", "field"}); '' when it does not. */
export function refusedField(error: unknown): string {
  return (error as { field?: string }).field || '';
}
