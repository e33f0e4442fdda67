"""REST API of the lab panel, under `<base_url>/mlx-jupyter/`.

GET    clusters               every cluster: id, owner, backend, hosts, state, ranks with health and
                              where each is (this server's clusters: ``where``, ``diagnosis``)
POST   clusters               {"n", "hosts", "hostfile", "backend"}: start one here (202, then poll);
                              backend null: the default (vocab/backends.py DEFAULT_RULE)
GET    clusters/<id>          one cluster
DELETE clusters/<id>          stop a cluster this server started (409 for a kernel's)
POST   clusters/<id>/restart  restart a cluster this server started, keeping its ranks' names:
                              {"report"} (the one line); 409 for a kernel's, 404 for none
GET    clusters/<id>/connect  {"code"}: the code that connects a notebook to it
GET    clusters/<id>/dashboard?since=T  the cluster as listed, plus ``series`` (its ranks' CPU, memory,
                              ops/s and bytes/s, the points after T; all of the last 5 min without
                              T; null for a kernel's cluster) and ``profile`` (its last --profile
                              timeline: svg, summary, time; null when none was recorded)
GET    schema                 the start form's fields: name, label, type, limits, help (the panel's form)
GET    backends               {"backends"}: the backends a cluster can start with (the panel's choices)

Authorization is jupyter_server's (its ``Authorizer``), on the resource ``mlx_clusters``: the
GETs are ``read``; starting and stopping clusters is ``execute`` (they are processes that run
code, as kernels are). A refused request is 403; a malformed one 400 naming the field.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import tornado
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from mlx_jupyter.hostfile import BACKENDS

from .manager import ClusterManager, connect_code
from .requests import RequestError, form_fields, parse_start

#: the resource jupyter_server's Authorizer is asked about
AUTH_RESOURCE = "mlx_clusters"
#: starting or stopping a cluster starts or ends processes that run code: as much as a kernel
EXECUTE = "execute"


class _Base(APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def manager(self) -> ClusterManager:
        manager: ClusterManager = self.settings["mlx_jupyter_manager"]
        return manager

    def reply(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    async def find(self, cluster_id: str) -> dict[str, Any] | None:
        return next((c for c in await self.manager.listing() if c["id"] == cluster_id), None)


class ClustersHandler(_Base):
    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        self.reply({"clusters": await self.manager.listing()})

    @tornado.web.authenticated
    @authorized(EXECUTE)
    async def post(self) -> None:
        try:
            req = parse_start(self.request.body)
            entry = await self.manager.create(n=req.n, hosts=req.hosts, hostfile=req.hostfile, backend=req.backend)
        except RequestError as exc:
            self.reply({"error": str(exc), "field": exc.field}, 400)
            return
        except (ValueError, TypeError) as exc:   # the cluster refused its arguments (its message names them)
            self.reply({"error": str(exc)}, 400)
            return
        task = asyncio.ensure_future(self.manager.start(entry))
        self.settings.setdefault("mlx_jupyter_tasks", set()).add(task)
        task.add_done_callback(self.settings["mlx_jupyter_tasks"].discard)
        self.reply({"id": entry.cluster.cluster_id, "state": entry.state}, 202)


class ClusterHandler(_Base):
    @tornado.web.authenticated
    @authorized
    async def get(self, cluster_id: str) -> None:
        found = await self.find(cluster_id)
        self.reply(found or {"error": f"no cluster {cluster_id}"}, 200 if found else 404)

    @tornado.web.authenticated
    @authorized(EXECUTE)
    async def delete(self, cluster_id: str) -> None:
        done = await self.manager.stop(cluster_id)
        if done:
            self.reply({"id": cluster_id, "state": done})
            return
        found = await self.find(cluster_id)
        if found is None:
            self.reply({"error": f"no cluster {cluster_id}"}, 404)
        else:
            self.reply({"error": f"{cluster_id} belongs to a kernel (pid {found.get('owner_pid')}): "
                                 "stop it there with %mlx_cluster stop"}, 409)


class RestartHandler(_Base):
    @tornado.web.authenticated
    @authorized(EXECUTE)
    async def post(self, cluster_id: str) -> None:
        try:
            report = await self.manager.restart(cluster_id)
        except Exception as exc:  # the cluster's own message; the card shows it
            self.reply({"error": f"{cluster_id} did not restart: {exc}"}, 500)
            return
        if report is not None:
            self.reply({"id": cluster_id, "state": "running", "report": report})
            return
        found = await self.find(cluster_id)
        if found is None:
            self.reply({"error": f"no cluster {cluster_id}"}, 404)
        else:
            self.reply({"error": f"{cluster_id} belongs to a kernel (pid {found.get('owner_pid')}): "
                                 "restart it in that kernel's notebook with %mlx_cluster restart"}, 409)


class ConnectHandler(_Base):
    @tornado.web.authenticated
    @authorized
    async def get(self, cluster_id: str) -> None:
        if await self.find(cluster_id) is None:
            self.reply({"error": f"no cluster {cluster_id}"}, 404)
            return
        state = self.manager.state_of(cluster_id)
        if state not in (None, "running"):  # a notebook could not connect: say why instead of giving code
            why = "did not start (see its error); dismiss it" if state == "failed" else f"is {state}"
            self.reply({"error": f"{cluster_id} {why}"}, 409)
            return
        self.reply({"id": cluster_id, "code": connect_code(cluster_id)})


class DashboardHandler(_Base):
    @tornado.web.authenticated
    @authorized
    async def get(self, cluster_id: str) -> None:
        raw = self.get_argument("since", "")
        try:
            since = float(raw) if raw else None
        except ValueError:
            self.reply({"error": "since: a time in seconds since the epoch, as the last point's t", "field": "since"}, 400)
            return
        found = await self.manager.dashboard(cluster_id, since)
        self.reply(found or {"error": f"no cluster {cluster_id}"}, 200 if found else 404)


class SchemaHandler(_Base):
    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        self.reply({"fields": form_fields()})


class BackendsHandler(_Base):
    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        self.reply({"backends": list(BACKENDS)})


def setup_handlers(web_app: Any, manager: ClusterManager) -> None:
    """Mount the API on the server's tornado application."""
    web_app.settings["mlx_jupyter_manager"] = manager
    base = url_path_join(web_app.settings["base_url"], "mlx-jupyter")
    ident = r"(?P<cluster_id>[A-Za-z0-9_.-]+)"
    web_app.add_handlers(".*$", [
        (url_path_join(base, "clusters"), ClustersHandler),
        (url_path_join(base, "clusters", ident), ClusterHandler),
        (url_path_join(base, "clusters", ident, "connect"), ConnectHandler),
        (url_path_join(base, "clusters", ident, "restart"), RestartHandler),
        (url_path_join(base, "clusters", ident, "dashboard"), DashboardHandler),
        (url_path_join(base, "backends"), BackendsHandler),
        (url_path_join(base, "schema"), SchemaHandler),
    ])
