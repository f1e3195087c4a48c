"""The ``gpufence`` command line: one module per verb group (``main`` builds the typer app).

``main.py`` (the app; ``validate``, ``demo``, ``sim`` and ``size`` with their options), ``up.py``
(the server verb), ``control.py`` (the client verbs: submit, queue, status, ...), ``render.py``
(how they show things), ``sim.py`` (what ``sim`` and ``size`` run), ``demo.py`` (the simulated
demo's progress and summary).
"""

from gpufence.cli.main import app, main

__all__ = ["app", "main"]
