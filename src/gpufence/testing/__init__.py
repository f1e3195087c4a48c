"""Test support shipped with the package: builders, a fake executor, the fake NVML and waiting
helpers, so tests (ours and yours) build clusters and drive the control plane the same way."""
