"""One definition of every measure both front ends report (pure functions over plain data).

The simulator's ``metrics.json`` (``sim/summary.py``, ``sim/policy_run.py``), the control plane's
Prometheus exporter (``control/metrics.py``) and the benchmarks (``bench/``) compute their figures
with these functions, so a number means the same thing wherever it is shown:

  distribution   percentiles (p50/p95/p99/max), mean with a 95 % Student-t interval over seeds
  delays         queue delay (submit -> first start) and JCT (submit -> completion), both for the
                 jobs that got there and for all jobs with the unfinished ones censored at the
                 horizon, with counts
  capacity       allocation ratio, utilisation, fragmentation (free capacity a reference request
                 cannot use, FGD's definition), the largest placeable gang
  slo            serving SLO attainment over scoring windows, requests within the SLO, the worst
                 window
  interconnect   per-link-class utilisation summaries (p50/p95/max/mean over links and time)
  incidents      which stop reasons are preemptions, reclaims and losses; GPU-hours

No I/O, no clocks, no randomness; imports nothing but ``gpufence.model`` (never sim/, control/ or
the scheduling core), so both front ends and the benchmarks can use it.
"""
