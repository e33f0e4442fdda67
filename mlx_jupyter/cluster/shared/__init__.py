"""What both sides of a cluster use (the notebook's ``cluster`` and the ranks' ``cluster.rank``,
and the controller process): the cell channel's signed frames and TCP transport, the watch on
ZMQ sockets, ipyparallel's internals behind one module, the controller's connection files, and
:class:`ClusterError`. Nothing here imports either side."""
