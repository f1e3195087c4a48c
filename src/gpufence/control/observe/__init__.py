"""The control plane's live observation: host I/O counters, serving latency, the series ring
behind ``GET /v1/series``, the Prometheus collectors and dcgm-exporter's job-mapping files.

Measures are defined once in ``gpufence.telemetry`` (``measures`` names every exported metric);
this package only collects and keeps them.
"""
