"""Language models with MLX-LM: a tiny random model folder made offline (:mod:`.tiny`) and loading
one sharded over a cluster's ranks (:mod:`.sharded`)."""

from __future__ import annotations
