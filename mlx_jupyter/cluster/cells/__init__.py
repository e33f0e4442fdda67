"""Running a notebook cell on the ranks: the direct channel, supervision, display."""
