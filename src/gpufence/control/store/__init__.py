"""Durable control-plane state: the SQLite store (recovery from it is
``control/recovery``)."""
