"""The serving latency model against queueing theory and an independent request-level DES.

* exact M/M/c p99 of the response time on a (c, ρ) grid — computed here independently (Erlang
  C from its defining sum, the hypoexponential CDF in pure Python, bisection) — within 2 %;
* the figures issue 14 quotes (40 ms mean service);
* a small FCFS multi-server DES written here (Poisson arrivals, exponential or gamma service,
  independent replications): the model lies in its 95 % interval for M/M/c, and within the
  interval plus the M/G/c approximation's documented error (5 %) for gamma service;
* sizing (``replicas_for_slo`` and ``gpufence size``) equal to an exact Erlang-C sizing.
"""

from __future__ import annotations

import heapq
import json
import math
import random
import statistics
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.sim.latency import p99_response_s, replicas_for_slo

SERVICE_S = 0.040
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


# ---------------------------------------------------------------- independent exact M/M/c
def erlang_c_exact(c: int, a: float) -> float:
    """C(c, A) from its definition (log-space terms, no shared code with the model)."""
    log_terms = [k * math.log(a) - math.lgamma(k + 1) for k in range(c)]
    log_last = c * math.log(a) - math.lgamma(c + 1) + math.log(c / (c - a))
    top = max([*log_terms, log_last])
    s = sum(math.exp(t - top) for t in log_terms)
    last = math.exp(log_last - top)
    return last / (s + last)


def mmc_cdf(t: float, c: int, lam: float, s: float) -> float:
    mu = 1.0 / s
    cw = erlang_c_exact(c, lam / mu)
    theta = c * mu - lam
    service = 1.0 - math.exp(-mu * t)
    if abs(theta - mu) < 1e-12:
        both = 1.0 - (1.0 + mu * t) * math.exp(-mu * t)
    else:  # P(Exp(θ) + Exp(μ) ≤ t)
        both = 1.0 - (mu * math.exp(-theta * t) - theta * math.exp(-mu * t)) / (mu - theta)
    return (1.0 - cw) * service + cw * both


def mmc_p99(c: int, lam: float, s: float) -> float:
    lo, hi = 0.0, 1.0
    while mmc_cdf(hi, c, lam, s) < 0.99:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mmc_cdf(mid, c, lam, s) < 0.99 else (lo, mid)
    return hi


def exact_sizing(lam: float, s: float, slo: float) -> int:
    c = math.floor(lam * s) + 1
    while mmc_p99(c, lam, s) > slo:
        c += 1
    return c


GRID = [(c, rho) for c in (1, 2, 4, 8, 16, 32, 64) for rho in (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)]


@pytest.mark.parametrize(("c", "rho"), GRID, ids=[f"c{c}-rho{r}" for c, r in GRID])
def test_p99_within_2_percent_of_exact_mmc(c: int, rho: float) -> None:
    lam = rho * c / SERVICE_S
    exact = mmc_p99(c, lam, SERVICE_S)
    assert p99_response_s(c, lam, SERVICE_S) == pytest.approx(exact, rel=0.02)


@pytest.mark.parametrize(
    ("c", "rho", "ms"),
    [(1, 0.5, 368), (4, 0.6, 199), (16, 0.9, 211), (64, 0.95, 194)],
)
def test_the_issues_reference_values(c: int, rho: float, ms: float) -> None:
    assert p99_response_s(c, rho * c / SERVICE_S, SERVICE_S) * 1000 == pytest.approx(ms, abs=1)


def test_overload_has_no_p99_and_idle_pools_their_service_p99() -> None:
    assert p99_response_s(4, 4 / SERVICE_S, SERVICE_S) == math.inf
    assert p99_response_s(0, 1.0, SERVICE_S) == math.inf
    # no traffic: T = S ~ Exp, p99 = ln(100) x mean
    assert p99_response_s(4, 0.0, SERVICE_S) == pytest.approx(math.log(100) * SERVICE_S, rel=1e-5)


# ---------------------------------------------------------------- independent DES
def des_p99(c: int, lam: float, s: float, cv: float, n: int, seed: int) -> float:
    """p99 response of an FCFS c-server queue: each request takes the earliest free server."""
    rng = random.Random(seed)
    shape = 1.0 / (cv * cv)
    free = [0.0] * c
    t = 0.0
    resp: list[float] = []
    for i in range(n):
        t += rng.expovariate(lam)
        service = rng.gammavariate(shape, s / shape)
        start = max(t, heapq.heappop(free))
        heapq.heappush(free, start + service)
        if i >= n // 10:  # warm-up left out
            resp.append(start + service - t)
    resp.sort()
    return resp[int(0.99 * len(resp))]


def des_interval(
    c: int, rho: float, cv: float, reps: int = 8, n: int = 30_000
) -> tuple[float, float]:
    lam = rho * c / SERVICE_S
    xs = [des_p99(c, lam, SERVICE_S, cv, n, seed) for seed in range(reps)]
    half = 2.365 * statistics.stdev(xs) / math.sqrt(reps)  # t(0.975, 7)
    return statistics.mean(xs), half


@pytest.mark.parametrize(("c", "rho"), [(1, 0.5), (4, 0.7), (16, 0.8)])
def test_mmc_model_lies_in_the_des_interval(c: int, rho: float) -> None:
    mean, half = des_interval(c, rho, cv=1.0)
    model = p99_response_s(c, rho * c / SERVICE_S, SERVICE_S)
    assert abs(model - mean) <= half, (model, mean, half)


@pytest.mark.parametrize(("c", "rho", "cv"), [(4, 0.7, 0.5), (16, 0.8, 0.5), (16, 0.8, 1.5)])
def test_mgc_approximation_within_its_documented_error_of_the_des(
    c: int, rho: float, cv: float
) -> None:
    mean, half = des_interval(c, rho, cv=cv)
    model = p99_response_s(c, rho * c / SERVICE_S, SERVICE_S, service_cv=cv)
    assert abs(model - mean) <= half + 0.05 * mean, (model, mean, half)


# ---------------------------------------------------------------- sizing
SIZING = [(lam, slo) for lam in (20.0, 90.0, 250.0, 600.0) for slo in (0.2, 0.25, 0.3, 0.5)]


@pytest.mark.parametrize(
    ("lam", "slo"), SIZING, ids=[f"{lam:g}rps-{slo:g}s" for lam, slo in SIZING]
)
def test_replicas_for_slo_equals_exact_erlang_c_sizing(lam: float, slo: float) -> None:
    assert replicas_for_slo(lam, SERVICE_S, slo) == exact_sizing(lam, SERVICE_S, slo)


def test_no_count_meets_an_slo_below_the_service_p99() -> None:
    assert replicas_for_slo(10.0, SERVICE_S, 0.15) is None  # ln(100) x 40 ms = 184 ms


def test_gpufence_size_matches_exact_sizing_without_contention(tmp_path: Path) -> None:
    """The CLI's replica count for a serving-only scenario (nothing to contend with)."""
    sc = yaml.safe_load((EXAMPLES / "scenario-mixed-64.yaml").read_text())
    peak = 600.0
    sc.update(
        name="size-check",
        horizon_s=7200,
        services=[
            {
                "name": "api",
                "partition": "serving",
                "slo_p99_ms": 250,
                "service_ms": 40,
                "min_replicas": 1,
                "max_replicas": 64,
                "demand": {"diurnal": {"base_rps": peak, "peak_rps": peak}},
            }
        ],
    )
    for key in ("notebooks", "batch", "failures"):
        sc.pop(key, None)
    sc["training"] = {"arrivals_per_hour": 2, "gang_sizes": {1: 1.0}, "partition": "training"}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(sc))
    out = tmp_path / "size.json"
    res = CliRunner().invoke(
        app,
        [
            "size",
            str(EXAMPLES / "mixed-64.yaml"),
            str(path),
            "--slo-p99-ms",
            "250",
            "--seeds",
            "1..2",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    got = json.loads(out.read_text())
    assert got["replicas_at_peak"] == exact_sizing(peak, SERVICE_S, 0.25)
