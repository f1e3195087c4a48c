"""Placement plugins: each finds where a whole gang fits, without changing the ledger."""
