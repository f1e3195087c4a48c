"""Start-up recovery: what of a data directory still runs (``live_scan``), what the store cannot
know and must refuse (``strangers``), and adopting or settling each attempt (``recovery``)."""
