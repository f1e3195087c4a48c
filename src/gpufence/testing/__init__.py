"""Test support shipped with the package, so tests (ours and yours) build clusters and drive the
control plane the same way: ``builders`` (jobs and clusters), ``fake_executor`` (an in-memory
executor), ``reconciler_rig`` (a reconciler over it, one cycle at a time), ``fake_nvml`` (GPUs,
MIG, processes and NVLink without a GPU), ``fake_mps`` (an MPS control executable) and
``waiting`` (polling with a message that names what failed)."""
