"""Pure domain types: hardware, partitions, jobs, events and decisions (no I/O)."""
