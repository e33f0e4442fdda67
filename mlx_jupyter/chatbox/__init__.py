"""A chat with an MLX-LM model sharded over a cluster's ranks: ``mlx_jupyter.chat(...)``.

``events`` (pure: what rank 0 sends and how a reply is told), ``ranks`` (run on every rank: one
reply with MLX-LM's ``stream_generate``), ``stop`` (rank side: the Stop agreed by every rank at
the same token), ``session`` (the notebook's side of a chat, no widgets) and ``widget`` (the box).
"""

from __future__ import annotations
