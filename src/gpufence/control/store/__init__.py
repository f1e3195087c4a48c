"""Durable control-plane state: the SQLite store and crash recovery from it."""
