"""The lab panel's API serves the one list of backends (issue 13): a real jupyter server, one GET."""

from __future__ import annotations

import pytest

from mlx_jupyter.hostfile import BACKENDS
from tests.security.server_process import JupyterServer

pytestmark = pytest.mark.timeout(90)


def test_backends_endpoint_lists_the_hostfile_modules_backends(tmp_path):
    with JupyterServer(tmp_path, tmp_path) as server:
        assert server.request("GET", "/mlx-jupyter/backends")[1] == {"backends": list(BACKENDS)}
