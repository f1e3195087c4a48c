"""Trace-driven simulator: a virtual clock drives the same scheduler core as the control plane."""
