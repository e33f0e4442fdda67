"""The notebook side of one cell run: the direct channel's cell_server, supervision, display."""
