"""Serving latency model vs a request-level DES: the measured error of the p99 response time.

For a grid of replicas c, utilisation ρ and service CV (gamma service -- constant at CV 0 --,
Poisson arrivals, 40 ms mean), an FCFS c-server DES (each request takes the earliest free
replica) runs ``--reps`` independent replications of ``--requests`` requests (the first 10 %
dropped as warm-up); its p99 gets a 95 % Student-t interval over the replications. Printed per
cell: the DES p99 and interval, ``gpufence.sim.latency``'s p99 (exact M/M/c at cv = 1, exact
M/G/1 for one replica, the M/G/c approximation otherwise) and its error, and the pre-issue-14
formula p99(W) + p99(S) for comparison. Last line:
``max_abs_err_pct=X (cv=1: Y) cells_outside_interval=N old_max_err_pct=Z``.

    PYTHONPATH=src python bench/latency_model.py [--reps 6] [--requests 60000] [--quick]
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys

import numpy as np

from gpufence.sim.latency import erlang_c, p99_response_s

SERVICE_S = 0.040
T975 = {3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def des_p99(c: int, lam: float, cv: float, n: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / lam, n))
    if cv > 0:
        shape = 1.0 / (cv * cv)
        service = rng.gamma(shape, SERVICE_S / shape, n)
    else:  # deterministic
        service = np.full(n, SERVICE_S)
    free = [0.0] * c
    resp = np.empty(n)
    for i in range(n):
        t = arrivals[i]
        f = heapq.heappop(free)
        end = (t if t > f else f) + service[i]
        heapq.heappush(free, end)
        resp[i] = end - t
    return float(np.percentile(resp[n // 10 :], 99))


def old_p99(c: int, lam: float, cv: float) -> float:
    """The model before issue 14: p99 of the wait plus p99 of the service (≈ mean·(1 + 3.6cv))."""
    mu = 1.0 / SERVICE_S
    wait_prob = erlang_c(c, lam / mu)
    decay = (c * mu - lam) / ((1.0 + cv * cv) / 2.0)
    wait = math.log(wait_prob / 0.01) / decay if wait_prob > 0.01 else 0.0
    return wait + SERVICE_S * (1.0 + 3.6 * cv)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--requests", type=int, default=60_000)
    ap.add_argument("--quick", action="store_true", help="a 12-cell grid, fewer requests")
    args = ap.parse_args()
    cs = (4, 16) if args.quick else (1, 4, 16, 64)
    rhos = (0.5, 0.8) if args.quick else (0.5, 0.7, 0.8, 0.9)
    cvs = (0.0, 0.5, 1.0, 1.5)
    reps = max(3, min(args.reps, 10))
    errs: list[float] = []
    errs_exp: list[float] = []
    old_errs: list[float] = []
    outside = 0
    print("   c   rho   cv |  DES p99 ms  ±95%  | model ms   err  | old ms    err")
    for c in cs:
        for rho in rhos:
            for cv in cvs:
                lam = rho * c / SERVICE_S
                # long correlation times near saturation: more requests there
                n = args.requests * (4 if rho >= 0.9 else 1)
                if args.quick:
                    n //= 2
                xs = [des_p99(c, lam, cv, n, 1000 * c + seed) for seed in range(reps)]
                mean = float(np.mean(xs))
                half = T975[reps] * float(np.std(xs, ddof=1)) / math.sqrt(reps)
                model = p99_response_s(c, lam, SERVICE_S, service_cv=cv)
                old = old_p99(c, lam, cv)
                err = 100.0 * (model / mean - 1.0)
                old_err = 100.0 * (old / mean - 1.0)
                inside = abs(model - mean) <= half
                outside += 0 if inside else 1
                errs.append(abs(err))
                old_errs.append(old_err)
                if cv == 1.0:
                    errs_exp.append(abs(err))
                print(
                    f"{c:4d} {rho:5.2f} {cv:4.1f} | {mean * 1e3:8.1f} ±{half * 1e3:6.1f} | "
                    f"{model * 1e3:7.1f} {err:+6.1f}% {'' if inside else '*'}| "
                    f"{old * 1e3:7.1f} {old_err:+6.1f}%",
                    flush=True,
                )
    print("(* = model outside the DES interval)")
    print(
        f"max_abs_err_pct={max(errs):.1f} (cv=1: {max(errs_exp):.1f}) "
        f"cells_outside_interval={outside} old_max_err_pct={max(old_errs):+.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
