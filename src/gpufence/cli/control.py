"""``gpufence submit``, and ``register(app)``, which adds every control-plane verb to the app.

The verbs live by group: ``up.py`` (the server), ``job_verbs.py`` (queue, status, explain,
cancel, hold, release), ``update_verbs.py``, ``logs_verb.py``, ``cluster_verbs.py`` (nodes,
partitions, events, top, advise), ``context_verbs.py`` (the client config). How a client verb
finds its server and token, and its exit codes, are in ``connect.py``; ``-o`` / ``--watch`` /
``--limit`` in ``output.py``.
"""

from __future__ import annotations

import typer

from gpufence.cli import (
    account_verbs,
    accounting_verbs,
    cluster_verbs,
    job_verbs,
    pty_verbs,
    update_verbs,
)
from gpufence.cli.context_verbs import context_app
from gpufence.cli.logs_verb import logs
from gpufence.cli.node_verbs import node_app, reserve_app
from gpufence.cli.sbatch_verb import CONTEXT as SBATCH_CONTEXT
from gpufence.cli.sbatch_verb import USAGE as SBATCH_USAGE
from gpufence.cli.sbatch_verb import sbatch
from gpufence.cli.submit_verb import submit
from gpufence.cli.up import up

# ------------------------------------------------------------------------------------ submit


def register(app: typer.Typer) -> None:
    """Add the control-plane verbs to the ``gpufence`` app."""
    app.command()(up)
    app.command(context_settings={"allow_interspersed_args": False})(submit)
    app.command(context_settings=SBATCH_CONTEXT, options_metavar=SBATCH_USAGE)(sbatch)
    app.add_typer(account_verbs.queue_app, name="queue")  # jobs; `queue set|show`: QOS
    app.command()(job_verbs.status)
    app.command()(job_verbs.explain)
    app.command()(job_verbs.cancel)
    app.command()(job_verbs.hold)
    app.command()(job_verbs.release)
    app.command()(update_verbs.update)
    app.command()(logs)
    app.command(context_settings={"allow_interspersed_args": False})(pty_verbs.run)
    app.command()(pty_verbs.attach)
    app.command()(cluster_verbs.nodes)
    app.command()(cluster_verbs.partitions)
    app.command()(cluster_verbs.events)
    app.command()(cluster_verbs.top)
    app.command()(cluster_verbs.advise)
    app.command()(accounting_verbs.history)
    app.command()(accounting_verbs.usage)
    app.add_typer(context_app, name="context")
    app.add_typer(account_verbs.tenant_app, name="tenant")
    app.add_typer(account_verbs.token_app, name="token")
    app.command()(account_verbs.audit)
    app.add_typer(node_app, name="node")  # drain, undrain, list
    app.add_typer(reserve_app, name="reserve")  # maintenance windows
