"""Typed errors of the topology package: discovery (bad remote output) and planning."""

from __future__ import annotations


class TopologyError(Exception):
    """Base class: anything the topology package refuses, with a message for humans."""


class DiscoveryError(TopologyError):
    """A host's command output could not be used; names the host, the command and why."""

    def __init__(self, host: str, command: str, problem: str, fix: str | None = None) -> None:
        self.host = host
        self.command = command
        self.problem = problem
        self.fix = fix
        text = f"{host}: `{command}` {problem}"
        if fix:
            text += f". {fix}"
        super().__init__(text)


class PlanError(TopologyError):
    """The cabling cannot support what was asked (no ring, incomplete mesh, no RDMA, ...)."""
