"""Jupyter server extension behind the lab panel "MLX Cluster": a small REST API over `ClusterManager`.

Enabled by `etc/jupyter/jupyter_server_config.d/mlx_jupyter.json` (installed with the package),
or by hand: `jupyter server --ServerApp.jpserver_extensions="{'mlx_jupyter.server': True}"`.
The prebuilt lab extension lives in `labextension/` beside this file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

LABEXTENSION = Path(__file__).parent / "labextension"
LABEXTENSION_NAME = "mlx-jupyter-lab"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": str(LABEXTENSION), "dest": LABEXTENSION_NAME}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "mlx_jupyter.server"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    """Mount the REST API and remember the manager, to stop its clusters at exit."""
    from .handlers import setup_handlers
    from .manager import ClusterManager
    from .owners import server_kernels

    # hostfile paths are confined to what the server serves, as its contents API's are
    contents = getattr(server_app, "contents_manager", None)
    manager = ClusterManager(root_dir=server_app.root_dir, allow_hidden=bool(getattr(contents, "allow_hidden", False)),
                             kernel_pids=server_kernels(server_app))
    server_app.web_app.settings["mlx_jupyter_manager"] = manager
    setup_handlers(server_app.web_app, manager)
    server_app.log.info("mlx_jupyter.server: REST API at %smlx-jupyter/", server_app.web_app.settings["base_url"])


def _unload_jupyter_server_extension(server_app: Any) -> None:
    manager = server_app.web_app.settings.get("mlx_jupyter_manager")
    if manager is not None:
        manager.shutdown()


# older servers look for these names
load_jupyter_server_extension = _load_jupyter_server_extension
