import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';

import { ClusterDashboard } from './dashboard';
import { ClusterPanel } from './panel';

const ICON_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16">' +
  '<g class="jp-icon3" fill="#616161"><rect x="2" y="3" width="8" height="6" rx="1.5"/>' +
  '<rect x="14" y="3" width="8" height="6" rx="1.5"/><rect x="2" y="15" width="8" height="6" rx="1.5"/>' +
  '<rect x="14" y="15" width="8" height="6" rx="1.5"/><rect x="10" y="5.3" width="4" height="1.4"/>' +
  '<rect x="10" y="17.3" width="4" height="1.4"/><rect x="5.3" y="9" width="1.4" height="6"/>' +
  '<rect x="17.3" y="9" width="1.4" height="6"/></g></svg>';

export const clusterIcon = new LabIcon({ name: 'mlx-jupyter-lab:cluster', svgstr: ICON_SVG });

/** The "MLX Cluster" left sidebar panel. */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'mlx-jupyter-lab:plugin',
  description: 'MLX Cluster sidebar: clusters, ranks and health, start/stop, code to connect.',
  autoStart: true,
  optional: [INotebookTracker, ILayoutRestorer],
  activate: (app: JupyterFrontEnd, tracker: INotebookTracker | null, restorer: ILayoutRestorer | null) => {
    const insertCode = (code: string): boolean => {
      const panel = tracker?.currentWidget;
      if (!panel) {
        return false;
      }
      NotebookActions.insertBelow(panel.content);
      const cell = panel.content.activeCell;
      if (!cell) {
        return false;
      }
      cell.model.sharedModel.setSource(code);
      return true;
    };
    // one dashboard tab per cluster: opening it again brings that tab forward
    const dashboards = new Map<string, ClusterDashboard>();
    const openDashboard = (id: string): void => {
      let dash = dashboards.get(id);
      if (!dash || dash.isDisposed || !dash.isAttached) {
        dash?.dispose();
        dash = new ClusterDashboard(id);
        dashboards.set(id, dash);
        // a tab among the dashboards already open (another split would squeeze the notebook to a strip);
        // the first one beside the notebook in use, so both show while a cell runs; else a tab of its own
        const open = [...dashboards.values()].find(d => d !== dash && !d.isDisposed && d.isAttached);
        const beside = tracker?.currentWidget;
        app.shell.add(dash, 'main', open ? { mode: 'tab-after', ref: open.id }
          : beside && !beside.isDisposed ? { mode: 'split-right', ref: beside.id } : {});
      }
      app.shell.activateById(dash.id);
    };
    const panel = new ClusterPanel(insertCode, openDashboard);
    panel.title.icon = clusterIcon;
    app.shell.add(panel, 'left', { rank: 600 });
    if (restorer) {
      restorer.add(panel, 'mlx-jupyter-cluster-panel');
    }
    app.commands.addCommand('mlx-jupyter:open-dashboard', {
      label: 'Open an MLX cluster\'s dashboard',
      execute: args => openDashboard(String(args.id))
    });
    app.commands.addCommand('mlx-jupyter:show-panel', {
      label: 'Show the MLX Cluster panel',
      execute: () => app.shell.activateById(panel.id)
    });
  }
};

export default plugin;
