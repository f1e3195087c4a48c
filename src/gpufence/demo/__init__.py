"""``gpufence demo``: one story (``story``: the acts, their titles, what each shows) told on the
live control plane with real processes (``live``) and in the simulator (``simulated``);
``programs`` are the jobs the live demo runs, ``joblogs`` reads what they saw."""
