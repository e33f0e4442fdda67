"""Reaching hosts: ssh and free ports."""
