"""The ``gpufence`` command line: one module per verb group (``main`` builds the typer app).

``main.py`` (the app, ``validate``, ``demo``), ``up.py`` (the server verb), ``control.py`` (the
client verbs: submit, queue, status, ...), ``render.py`` (how they show things), ``sim.py``
(``sim`` and ``size``), ``demo.py`` (the demo's progress and summary).
"""

from gpufence.cli.main import app, main

__all__ = ["app", "main"]
