"""Cluster state: the allocation ledger (``ledger``, with fork/commit) and its invariants
(``invariants``). Fair-share usage accounting is the scheduler's (``sched/fairshare.py``)."""
