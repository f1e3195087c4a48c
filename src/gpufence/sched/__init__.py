"""The scheduler: queue order, admission, placement plugins, backfill, preemption, reclaim."""
