"""`mlx-jupyter config`: discover the cabling, plan addresses, set the hosts up, write a hostfile.

:mod:`.discovery` gathers what the hosts answer, :mod:`.setup` applies the address plan,
:mod:`.runners` reach the hosts (ssh, or a recording), :mod:`.command` is the command line.
"""

from __future__ import annotations

from mlx_jupyter.configurator.command import main, parser, ssh_options
from mlx_jupyter.configurator.discovery import Discovery, DiscoveryProgress, discover, ethernet_addresses
from mlx_jupyter.configurator.runners import CONNECT_TIMEOUT, Runner, SSHRunner
from mlx_jupyter.configurator.setup import apply_setup, hostfile_text, hosts_to_set_up, setup_argv

__all__ = ["CONNECT_TIMEOUT", "Discovery", "DiscoveryProgress", "Runner", "SSHRunner", "apply_setup",
           "discover", "ethernet_addresses", "hostfile_text", "hosts_to_set_up", "main", "parser", "setup_argv",
           "ssh_options"]
