"""Read models the web dashboard needs beyond the API's own (``http/dashboard_routes.py``).

``fair_share_tables`` runs on the reconciler thread (``Reconciler.call``), like ``views.py``: it
reads one consistent ledger between two cycles. The table is the one ``explain`` shows a job's
owner for its partition (queues, tenants, weights, holdings, decayed usage, rank), here for
every partition at once, so the queue page can show each tenant's fair-share position.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufence.control.reconciler import Reconciler


def fair_share_tables(r: Reconciler) -> dict[str, list[dict[str, Any]]]:
    sched = r.scheduler
    return {
        name: [dataclasses.asdict(t) for t in sched.fair_share(name)]
        for name in sched.cluster.partitions
    }
