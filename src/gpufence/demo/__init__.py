"""``gpufence demo``: one story told twice, on the live control plane (``live``) with real
processes and in the simulator (``simulated``); ``programs`` are the jobs it runs."""
