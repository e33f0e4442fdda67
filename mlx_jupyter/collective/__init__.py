"""The collective core's Python side: groups (ours and MLX's), array interop, the no-token warning."""
