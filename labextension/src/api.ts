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
  /** One line when the ranks are in different places (who waits for whom). */
  diagnosis?: string;
  /** The Slurm job the ranks run in, as squeue shows it now. */
  slurm?: { job_id: number; state?: string; nodes?: string | string[]; time_left_text?: string };
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
    throw new ServerConnection.ResponseError(response, (data && data.error) || response.statusText);
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
