"""The Ray executor: gang members on the Ray nodes the scheduler chose, through a node agent.

Importing this package does not import Ray; only ``ray_executor``, ``agent``, ``health``,
``nodes`` and ``local_cluster`` need it.
"""
