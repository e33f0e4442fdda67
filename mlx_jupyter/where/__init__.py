"""Where every rank is: samples of a rank's stack and collective activity, and their rendering.

:mod:`.sample` takes a sample inside a rank (its stack, our core's activity, CPU and memory);
:mod:`.model` turns samples into states, a table and a one-line diagnosis (pure, no I/O).
"""
