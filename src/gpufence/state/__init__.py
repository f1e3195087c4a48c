"""Cluster state: the allocation ledger (with invariants and fork/commit) and usage accounting."""
