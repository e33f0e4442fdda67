import { Widget } from '@lumino/widgets';

import { el, errorBox, healthSummary, rankTable } from './cardparts';
import {
  ICluster, IFormField, connectCode, getFormFields, listClusters, refusedField, restartCluster, slurmState,
  startCluster, stopCluster
} from './api';

/** How often the panel refreshes while it is visible (and never while hidden). */
const REFRESH_MS = 2000;

/** The form's CSS class per field (the browser tests and the style sheet name them). */
const FIELD_CLASS: Record<string, string> = {
  n: 'mlxj-n', hosts: 'mlxj-hosts-input', hostfile: 'mlxj-hostfile-input', backend: 'mlxj-backend'
};

/** What is wrong with a field's value by the schema's limits ('' when nothing): the server's words. */
function invalid(f: IFormField, value: string): string {
  if (f.kind === 'number') {
    const n = Number(value);
    if (value.trim() === '' || !Number.isInteger(n) || (f.min !== undefined && n < f.min) || (f.max !== undefined && n > f.max)) {
      return f.help;
    }
  } else if (f.maxLength !== undefined && value.length > f.maxLength) {
    return `${f.label}: at most ${f.maxLength} characters`;
  }
  return '';
}

/** The left sidebar panel "MLX Cluster". */
export class ClusterPanel extends Widget {
  constructor(private insertCode: (code: string) => boolean, private openDashboard: (id: string) => void = () => undefined) {
    super();
    this.id = 'mlx-jupyter-cluster-panel';
    this.title.caption = 'MLX Cluster';
    this.addClass('mlxj-panel');
    this.node.appendChild(el('h2', { class: 'mlxj-panel-title' }, 'MLX Cluster'));
    // beside ipyparallel's own "IPython Parallel" panel (installed with it): say which clusters are here
    this.node.appendChild(el('div', { class: 'mlxj-panel-what' },
      'MLX clusters: started here or with %mlx_cluster in a notebook. ipyparallel\'s own clusters are in its '
      + '"IPython Parallel" panel.'));
    this.form = el('form', { class: 'mlxj-panel-form', novalidate: '' });
    this.node.appendChild(this.form);
    void this.buildForm();
    this.message = el('div', { class: 'mlxj-panel-message', role: 'status' });
    this.node.appendChild(this.message);
    this.list = el('div', { class: 'mlxj-panel-list' });
    this.node.appendChild(this.list);
  }

  /** The start form, field by field from the server's schema (labels, limits, what each takes). */
  private async buildForm(): Promise<void> {
    let fields: IFormField[];
    try {
      fields = await getFormFields();
    } catch (error) {
      this.form.appendChild(el('div', { class: 'mlxj-error' }, `no start form: ${(error as Error).message}`));
      return;
    }
    for (const f of fields) {
      const id = `mlxj-field-${f.name}`;
      const box = el('div', { class: 'mlxj-field', 'data-field': f.name });
      box.appendChild(el('label', { class: 'mlxj-label', for: id }, f.label));
      let input: HTMLInputElement | HTMLSelectElement;
      if (f.kind === 'choice') {
        const select = el('select', { id, class: `jp-mod-styled ${FIELD_CLASS[f.name] || ''}`, title: f.help });
        for (const c of f.choices || []) {
          select.appendChild(el('option', { value: c }, c || 'default'));
        }
        const wrap = el('div', { class: 'jp-select-wrapper mlxj-select' });
        wrap.appendChild(select);
        box.appendChild(wrap);
        input = select;
      } else {
        input = el('input', {
          id, type: f.kind === 'number' ? 'number' : 'text', class: `jp-mod-styled ${FIELD_CLASS[f.name] || ''}`,
          placeholder: f.placeholder, title: f.help, 'aria-describedby': `${id}-msg`
        });
        if (f.kind === 'number') {
          input.setAttribute('min', String(f.min ?? 1));
          input.setAttribute('max', String(f.max ?? 64));
          input.value = String(f.default ?? 2);
        }
        box.appendChild(input);
        input.addEventListener('input', () => this.check(f.name));
      }
      box.appendChild(el('div', { class: 'mlxj-field-msg', id: `${id}-msg` }));
      this.form.appendChild(box);
      this.fields.set(f.name, { spec: f, input, box });
    }
    const start = el('button', { type: 'submit', class: 'jp-mod-styled jp-mod-accept mlxj-start' }, 'Start');
    this.form.appendChild(start);
    this.form.addEventListener('submit', event => {
      event.preventDefault();
      void this.start();
    });
  }

  private value(name: string): string {
    return (this.fields.get(name)?.input.value || '').trim();
  }

  /** Show ``text`` under the field (and mark it invalid), or clear it. */
  private fieldMessage(name: string, text: string): void {
    const f = this.fields.get(name);
    if (!f) {
      return;
    }
    f.box.classList.toggle('mlxj-invalid', !!text);
    f.input.setAttribute('aria-invalid', text ? 'true' : 'false');
    const msg = f.box.querySelector('.mlxj-field-msg');
    if (msg) {
      msg.textContent = text;
    }
  }

  /** Check one field (or all) by the schema's limits; whether they are all fine. */
  private check(only?: string): boolean {
    let ok = true;
    for (const [name, f] of this.fields) {
      if (only && name !== only) {
        continue;
      }
      let why = invalid(f.spec, f.input.value);
      const other = f.spec.excludes;
      if (!why && other && this.value(name) && this.value(other)) {
        why = f.spec.excludes_why || `not with ${other}`;   // the server's words (form_fields)
      }
      this.fieldMessage(name, why);
      ok = ok && !why;
    }
    return ok;
  }

  private async start(): Promise<void> {
    if (!this.check()) {
      this.say('the start form has a field to fix (see under it)', true);
      return;
    }
    const n = parseInt(this.value('n'), 10) || 2;
    this.say(`starting ${n} ranks…`);
    try {
      const reply = await startCluster(n, this.value('hosts'), this.value('backend'), this.value('hostfile'));
      this.say(`${reply.id} starting`);
      this.followed = reply.id;
    } catch (error) {
      const field = refusedField(error);
      if (this.fields.has(field)) {   // the server's refusal names the field: shown under it too
        this.fieldMessage(field, (error as Error).message);
      }
      this.say(`start failed: ${(error as Error).message}`, true);
    }
    await this.refresh();
  }

  /** Show a message; it stops following a cluster's state. */
  private say(text: string, error = false): void {
    this.followed = '';
    this.message.textContent = text;
    this.message.classList.toggle('mlxj-error', error);
  }

  /** Fetch the clusters and redraw; errors are shown, not thrown. */
  async refresh(): Promise<void> {
    try {
      this.render(await listClusters());
    } catch (error) {
      this.say(`cannot reach the mlx-jupyter server extension: ${(error as Error).message}`, true);
    }
  }

  /** While the message is about the cluster started last, keep it in step with that cluster's card. */
  private follow(clusters: ICluster[]): void {
    const id = this.followed;
    if (!id) {
      return;
    }
    const c = clusters.find(x => x.id === id);
    if (!c) {
      this.followed = '';
      this.say(`${id} is gone`, true);
    } else if (c.state === 'failed') {
      this.followed = '';
      this.say(`${id} failed to start`, true);
    } else if (c.state !== 'starting') {
      const detail = c.ranks?.length ? healthSummary(c.ranks, c.story) : `${c.size} ranks`;
      this.message.textContent = `${id} ${c.state}: ${detail}`;
    }
  }

  private render(clusters: ICluster[]): void {
    this.follow(clusters);
    this.list.replaceChildren();
    // other processes' clusters (other Jupyter servers, scripts) come and go: apart, behind a toggle
    const others = clusters.filter(c => c.owner_kind === 'other');
    const ours = clusters.filter(c => c.owner_kind !== 'other');
    if (!ours.length) {
      const empty = el('div', { class: 'mlxj-empty' }, 'No cluster running. Start one above, or run ');
      empty.appendChild(el('code', { class: 'mlxj-nowrap' }, '%mlx_cluster start -n 2'));
      empty.appendChild(document.createTextNode(' in a notebook: it shows here.'));
      this.list.appendChild(empty);
    }
    this.renderCards(ours, this.list);
    if (others.length) {
      const toggle = el('button', { class: 'jp-mod-styled mlxj-others-toggle', 'aria-expanded': String(this.showOthers),
        title: 'clusters started by other processes of yours (other Jupyter servers, notebooks or scripts)' },
        `${this.showOthers ? '▾' : '▸'} Other processes' clusters (${others.length})`);
      toggle.addEventListener('click', () => {
        this.showOthers = !this.showOthers;
        void this.refresh();
      });
      this.list.appendChild(toggle);
      if (this.showOthers) {
        const box = el('div', { class: 'mlxj-others' });
        this.renderCards(others, box);
        this.list.appendChild(box);
      }
    }
  }

  private renderCards(clusters: ICluster[], into: HTMLElement): void {
    for (const c of clusters) {
      const card = el('div', { class: `mlxj-card mlxj-card-${c.state}`, 'data-cluster': c.id });
      const head = el('div', { class: 'mlxj-card-head' });
      head.appendChild(el('span', { class: 'mlxj-card-id' }, c.id));
      head.appendChild(el('span', { class: `mlxj-pill mlxj-pill-${c.state}` }, c.state));
      card.appendChild(head);
      // a cluster that failed before its ranks were counted has no size: say nothing rather than "? ranks"
      const size = c.size ? `${c.size} rank${c.size === 1 ? '' : 's'} · ` : '';
      card.appendChild(el('div', { class: 'mlxj-card-sub' }, `${c.backend} · ${size}${c.hosts.join(', ')}`));
      card.appendChild(el('div', { class: 'mlxj-card-sub mlxj-card-owner' },
        c.owner_text || (c.owner === 'server' ? 'started from this panel' : `started by kernel pid ${c.owner_pid}`)));
      if (c.slurm) {
        const s = c.slurm;
        const nodes = Array.isArray(s.nodes) ? s.nodes.join(',') : (s.nodes || '');
        const parts = [`Slurm job ${s.job_id}`, slurmState(s, nodes), s.time_left_text ? `${s.time_left_text} left` : ''];
        card.appendChild(el('div', { class: 'mlxj-card-sub mlxj-card-slurm' }, parts.filter(p => p).join(' · ')));
      }
      if (c.error) {
        card.appendChild(errorBox(c.error));
      }
      if (c.state === 'starting') {   // its ranks are not up yet: their count, not "0 of 2 ok, 2 not ok"
        card.appendChild(el('div', { class: 'mlxj-card-sub mlxj-card-starting' },
          `starting: ${c.connected ?? 0} of ${c.size || '?'} ranks connected…`));
      } else if (c.ranks && c.ranks.length) {
        card.appendChild(el('div', { class: 'mlxj-card-health' }, healthSummary(c.ranks, c.story)));
        card.appendChild(rankTable(c.ranks));
        // where each busy rank is, as lines that wrap (a column would widen the card)
        for (const r of c.ranks.filter(r => r.where && r.where !== 'idle' && r.where !== r.state)) {
          card.appendChild(el('div', { class: 'mlxj-card-where' }, `rank ${r.rank}: ${r.where}`));
        }
        if (c.diagnosis) {
          card.appendChild(el('div', { class: 'mlxj-card-diagnosis' }, c.diagnosis));
        }
        if (c.restart_report) {   // issue 33: where the restarted ranks' names came from
          card.appendChild(el('div', { class: 'mlxj-card-restart' }, `last ${c.restart_report}`));
        }
      }
      const actions = el('div', { class: 'mlxj-card-actions' });
      if (c.state === 'failed') {
        // nothing runs: no code to connect to it, only its error and a way to clear the card
        if (c.owner === 'server') {
          const dismiss = el('button', { class: 'jp-mod-styled mlxj-dismiss', title: 'remove this failed cluster from the list' },
            'Dismiss');
          dismiss.addEventListener('click', () => void this.stop(c.id, 'dismissing'));
          actions.appendChild(dismiss);
        }
        card.appendChild(actions);
        into.appendChild(card);
        continue;
      }
      if (this.confirming && this.confirming.id === c.id) {
        // Stop and Restart end the ranks (and what they hold): asked once more, in the card itself
        const what = this.confirming.action;
        const ask = el('div', { class: 'mlxj-confirm-box' });
        ask.appendChild(el('span', { class: 'mlxj-confirm-text' },
          what === 'stop' ? `Stop ${c.id}? Its ranks end.` : `Restart ${c.id}? Fresh ranks, the same names on them.`));
        const yes = el('button', { class: `jp-mod-styled ${what === 'stop' ? 'jp-mod-warn' : 'jp-mod-accept'} mlxj-confirm` },
          what === 'stop' ? 'Stop' : 'Restart');
        yes.addEventListener('click', () => {
          this.confirming = null;
          void (what === 'stop' ? this.stop(c.id) : this.restart(c.id));
        });
        const no = el('button', { class: 'jp-mod-styled mlxj-cancel' }, 'Cancel');
        no.addEventListener('click', () => {
          this.confirming = null;
          void this.refresh();
        });
        ask.appendChild(yes);
        ask.appendChild(no);
        card.appendChild(ask);
        into.appendChild(card);
        continue;
      }
      const dash = el('button', { class: 'jp-mod-styled mlxj-open-dashboard',
        title: 'a live dashboard of this cluster in a tab: ranks, where each is, memory, the Slurm job' }, 'Dashboard');
      dash.addEventListener('click', () => this.openDashboard(c.id));
      actions.appendChild(dash);
      const insert = el('button', { class: 'jp-mod-styled mlxj-insert' }, 'Use in notebook');
      insert.addEventListener('click', () => void this.insert(c.id));
      actions.appendChild(insert);
      if (c.owner === 'server' && c.state === 'running') {
        // the server owns it: it restarts it, keeping the ranks' names (a kernel's: in that notebook)
        const restart = el('button', { class: 'jp-mod-styled mlxj-restart', title: "fresh ranks, the same names on them" },
          'Restart');
        restart.addEventListener('click', () => this.confirm(c.id, 'restart'));
        actions.appendChild(restart);
      }
      if (c.owner === 'server' && c.state !== 'stopping') {
        const stop = el('button', { class: 'jp-mod-styled jp-mod-warn mlxj-stop' }, 'Stop');
        stop.addEventListener('click', () => this.confirm(c.id, 'stop'));
        actions.appendChild(stop);
      }
      card.appendChild(actions);
      into.appendChild(card);
    }
  }

  /** Ask in the card before a Stop or Restart; the question stays until it is answered (Cancel takes it back). */
  private confirm(id: string, action: 'stop' | 'restart'): void {
    this.confirming = { id, action };
    void this.refresh();
  }

  private async stop(id: string, doing = 'stopping'): Promise<void> {
    this.say(`${doing} ${id}…`);
    try {
      const reply = (await stopCluster(id)) as { state?: string };
      this.say(`${id} ${reply?.state || 'stopped'}`);
    } catch (error) {
      this.say(`${doing === 'stopping' ? 'stop' : 'dismiss'} failed: ${(error as Error).message}`, true);
    }
    await this.refresh();
  }

  private async restart(id: string): Promise<void> {
    this.followed = '';
    this.say(`restarting ${id}, keeping its ranks' names…`);
    let said: [string, boolean];
    try {
      await restartCluster(id);
      said = [`${id} restarted: its card says what came back`, false];   // the report is on the card, once
    } catch (error) {
      said = [`restart failed: ${(error as Error).message}`, true];
    }
    // the table first, so the "kept" line never sits above the old ranks' rows
    await this.refresh();
    this.say(...said);
  }

  private async insert(id: string): Promise<void> {
    try {
      const code = await connectCode(id);
      if (this.insertCode(code)) {
        this.say(`inserted a cell that connects to ${id}: run it, then %%mlx_distributed cells run there`);
      } else {
        await navigator.clipboard?.writeText(code);
        this.say('no notebook open: the code is on the clipboard');
      }
    } catch (error) {
      this.say(`cannot get the code: ${(error as Error).message}`, true);
    }
  }

  protected onAfterShow(): void {
    void this.refresh();
    this.timer = window.setInterval(() => void this.refresh(), REFRESH_MS);
  }

  protected onAfterHide(): void {
    window.clearInterval(this.timer);
  }

  dispose(): void {
    window.clearInterval(this.timer);
    super.dispose();
  }

  private form: HTMLFormElement;
  private fields = new Map<string, { spec: IFormField; input: HTMLInputElement | HTMLSelectElement; box: HTMLElement }>();
  private showOthers = false;
  private message: HTMLElement;
  private list: HTMLElement;
  private timer = 0;
  private followed = '';
  private confirming: { id: string; action: 'stop' | 'restart' } | null = null;
}
