"""The notebook side of one cell run: the direct channel's server, supervision, display."""
