"""Removing a keep-state restart's folders on the ranks' hosts when no rank of ours is left there
to do it (the new ranks failed to start): this machine's directly, another host's over ssh, with
the cluster's ssh options, as its ranks were reached."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Mapping, Optional

from mlx_jupyter.cluster.rank import keep_files
from mlx_jupyter.net import ssh
from mlx_jupyter.vocab.hosts import is_local


def removal_command(names: list[str]) -> str:
    """The shell command that removes ``names`` (folder names of ours, checked) wherever a host
    keeps them: shared memory, else the temp dir (as ``keep_files.keep_root`` chooses there)."""
    for name in names:
        if keep_files.owner_of(name) is None:
            raise ValueError(f"not a keep folder name: {name!r}")
    paths = " ".join(f'"$d"/{ssh.quote(n)}' for n in names)
    return f'for d in /dev/shm "${{TMPDIR:-/tmp}}" /tmp; do rm -rf -- {paths}; done'


async def _remove_remote(host: str, names: list[str], opts: Optional[ssh.SSHOptions], timeout: float) -> None:
    conn = await asyncio.wait_for(ssh.connect(host, opts), timeout)
    try:
        done = await ssh.run(conn, ssh.sh_command(removal_command(names)), timeout, host)
        if done.exit_status not in (0, None):
            raise ssh.SSHError(host, f"rm exited {done.exit_status}: {str(done.stderr or '').strip()[:200]}")
    finally:
        conn.close()


async def _remove_all(by_host: Mapping[str, list[str]], opts: Optional[ssh.SSHOptions],
                      timeout: float) -> dict[str, str]:
    hosts = list(by_host)
    results = await asyncio.gather(*(_remove_remote(h, by_host[h], opts, timeout) for h in hosts),
                                   return_exceptions=True)
    return {h: str(r).splitlines()[0] if str(r) else type(r).__name__
            for h, r in zip(hosts, results) if isinstance(r, BaseException)}


def remove_on_hosts(by_host: Mapping[str, list[str]], ssh_options: Any = None,
                    timeout: float = 15.0) -> dict[str, str]:
    """Remove each host's folders ``by_host[host]``: here directly, elsewhere over ssh (hosts at
    once, each within ``timeout`` s). Host -> why it failed, for those that did."""
    failed: dict[str, str] = {}
    remote = {h: list(names) for h, names in by_host.items() if names and not is_local(h)}
    for h, names in by_host.items():
        if h not in remote:
            for name in names:
                keep_files.remove_all(name)
    if not remote:
        return failed
    box: dict[str, Any] = {}

    def run() -> None:   # a loop of its own: the caller's thread may be running one (a kernel's)
        try:
            box["failed"] = asyncio.run(_remove_all(remote, ssh_options, timeout))
        except BaseException as exc:  # noqa: BLE001 - reported per host below
            box["error"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=run, name="mlx-keep-cleanup", daemon=True)
    t.start()
    t.join(timeout + 5)
    if t.is_alive():
        return {h: f"ssh did not finish within {timeout:g} s" for h in remote}
    if "error" in box:
        return {h: box["error"] for h in remote}
    failed.update(box["failed"])
    return failed
