"""Workload sources: loaders for public traces and generators of scenarios."""
