"""Reaching hosts: ssh, words a remote shell gets literally, names to addresses (the host and port
rules they follow are :mod:`mlx_jupyter.vocab.hosts` and :mod:`mlx_jupyter.vocab.ports`)."""
