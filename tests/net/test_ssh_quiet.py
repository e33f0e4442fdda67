"""No `CryptographyDeprecationWarning: DSA is deprecated` (10 lines) before an ssh error (issue 30 §4 item 5).

asyncssh names cryptography's deprecated DSA classes as it imports; we silence that one warning
from asyncssh's modules only. Every connection here is to loopback, on a port nobody listens on.
"""

from __future__ import annotations

import subprocess
import sys

from mlx_jupyter.vocab.ports import free_port_block

DSA = "DSA is deprecated"


def run(*argv: str) -> subprocess.CompletedProcess:
    # -W default: show every warning once, as a user's shell would (pytest's own filters do not apply)
    return subprocess.run([sys.executable, "-W", "default", *argv], capture_output=True, text=True, timeout=60)


def test_importing_asyncssh_alone_does_warn_here():
    """The control: without our filter the installed asyncssh/cryptography print it (else the tests
    below would prove nothing; if a release stops warning, this one says so)."""
    p = run("-c", "import asyncssh")
    assert p.returncode == 0, p.stderr
    assert DSA in p.stderr, "asyncssh no longer warns about DSA: the filter in net/ssh.py may go"


def test_an_ssh_error_comes_without_the_dsa_warnings(tmp_path):
    port = free_port_block(1, 1)
    code = ("import asyncio\nfrom mlx_jupyter.net import ssh\n"
            f"opts = ssh.SSHOptions(port={port}, connect_timeout=5, config=[])\n"
            "try:\n    asyncio.run(ssh.connect('127.0.0.1', opts))\n"
            "except ssh.SSHError as exc:\n    print(exc)\n")
    p = run("-c", code)
    assert "connection refused" in p.stdout, p.stdout + p.stderr
    assert DSA not in p.stderr and "Warning" not in p.stderr, p.stderr


def test_config_over_ssh_shows_only_the_error(tmp_path):
    port = free_port_block(1, 1)
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host node-x\n  HostName 127.0.0.1\n  Port {port}\n")
    p = run("-m", "mlx_jupyter", "config", "--hosts", "node-x", "--ssh-config", str(cfg), "--connect-timeout", "5")
    assert p.returncode == 1
    assert p.stderr.startswith("error: `ssh` could not reach these hosts:\n  - node-x: ssh to node-x: connection "
                               "refused"), p.stderr


def test_other_warnings_still_show():
    """Narrow: only that message, from asyncssh's modules; the same category from elsewhere is shown."""
    code = ("import warnings\nfrom mlx_jupyter.net import ssh\nssh._asyncssh()\n"
            "from cryptography.utils import CryptographyDeprecationWarning as W\n"
            "warnings.warn('DSA is deprecated (ours)', W)\nwarnings.warn('something else', W)\n")
    p = run("-c", code)
    assert "DSA is deprecated (ours)" in p.stderr and "something else" in p.stderr, p.stderr
