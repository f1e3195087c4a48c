"""The reconciler: the control plane's only writer and the only caller of the scheduler.

``loop`` holds the thread and its cycle; the cycle's three phases write through ``item_writes``
(inbox items), ``job_writes`` (submits, arrays, hold/release) and ``decision_writes`` (the
core's decisions), each given a ``WriteContext`` (``context``), never the reconciler itself.
"""

from gpufence.control.reconciler.loop import Reconciler

__all__ = ["Reconciler"]
