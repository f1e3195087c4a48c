"""Issue 33, item 11: the serving model off exponential service.

* one replica with Poisson arrivals is the exact M/G/1 queue (Pollaczek–Khinchine): against
  Erlang's closed form for M/D/1 (computed here, no shared code) within 0.5 %, and against a
  request-level DES within its 95 % interval plus 1.5 % for gamma service -- the two-moment
  approximation used before was +5-7 % at cv 0.5, ρ <= 0.7 and +8.7 % for M/D/1 at ρ = 0.7;
* a deterministic service is a constant (it was clipped to cv 0.1: +24.7 % at c=64, ρ=0.7),
  and M/D/c against the DES within the M/G/c approximation's documented 5 %;
* the mean wait is Pollaczek–Khinchine's for c = 1 and Allen–Cunneen's for c > 1.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics

import pytest

from gpufence.sim.latency import Pools, erlang_c, p99_response_s

S = 0.040  # mean service (s)


def md1_wait_cdf(t: float, lam: float, d: float) -> float:
    """Erlang's M/D/1 waiting-time distribution (1909): P(W <= t) = (1 − ρ) Σ_{k=0}^{⌊t/D⌋}
    (λ(kD − t))^k / k! · e^{−λ(kD − t)}."""
    if t < 0:
        return 0.0
    rho = lam * d
    total = 0.0
    for k in range(int(t / d) + 1):
        x = lam * (k * d - t)
        total += x**k / math.factorial(k) * math.exp(-x)
    return (1.0 - rho) * total


def md1_p99(lam: float, d: float) -> float:
    lo, hi = 0.0, d
    while md1_wait_cdf(hi - d, lam, d) < 0.99:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if md1_wait_cdf(mid - d, lam, d) < 0.99 else (lo, mid)
    return hi


@pytest.mark.parametrize("rho", [0.3, 0.5, 0.7, 0.85])
def test_md1_p99_equals_erlangs_closed_form(rho: float) -> None:
    lam = rho / S
    exact = md1_p99(lam, S)
    assert p99_response_s(1, lam, S, service_cv=0.0) == pytest.approx(exact, rel=0.005)


def des_p99(c: int, lam: float, cv: float, n: int, seed: int) -> float:
    """p99 response of an FCFS c-server queue (gamma service; cv 0: constant)."""
    rng = random.Random(seed)
    shape = 1.0 / (cv * cv) if cv > 0 else 0.0
    free = [0.0] * c
    t = 0.0
    resp: list[float] = []
    for i in range(n):
        t += rng.expovariate(lam)
        service = rng.gammavariate(shape, S / shape) if cv > 0 else S
        start = max(t, heapq.heappop(free))
        heapq.heappush(free, start + service)
        if i >= n // 10:  # warm-up left out
            resp.append(start + service - t)
    resp.sort()
    return resp[int(0.99 * len(resp))]


def des_interval(
    c: int, rho: float, cv: float, reps: int = 6, n: int = 40_000
) -> tuple[float, float]:
    xs = [des_p99(c, rho * c / S, cv, n, seed) for seed in range(reps)]
    return statistics.mean(xs), 2.571 * statistics.stdev(xs) / math.sqrt(reps)  # t(0.975, 5)


@pytest.mark.parametrize(("rho", "cv"), [(0.3, 0.5), (0.5, 0.5), (0.7, 0.5), (0.5, 1.5)])
def test_mg1_p99_lies_in_the_des_interval(rho: float, cv: float) -> None:
    mean, half = des_interval(1, rho, cv)
    model = p99_response_s(1, rho / S, S, service_cv=cv)
    assert abs(model - mean) <= half + 0.015 * mean, (model, mean, half)


def test_a_deterministic_service_is_not_clipped_to_cv_0_1() -> None:
    """c=64, ρ=0.7: fewer than 1 % of requests wait, so the p99 is the service time itself."""
    c, lam = 64, 0.7 * 64 / S
    assert erlang_c(c, lam * S) < 0.01
    assert p99_response_s(c, lam, S, service_cv=0.0) == pytest.approx(S, rel=1e-6)


@pytest.mark.parametrize(("c", "rho"), [(4, 0.7), (16, 0.9)])
def test_mdc_within_the_approximations_documented_error_of_the_des(c: int, rho: float) -> None:
    mean, half = des_interval(c, rho, 0.0)
    model = p99_response_s(c, rho * c / S, S, service_cv=0.0)
    assert abs(model - mean) <= half + 0.05 * mean, (model, mean, half)


@pytest.mark.parametrize("cv", [0.0, 0.05, 0.5, 1.0, 2.0])
def test_mean_wait_is_pollaczek_khinchine_for_one_replica(cv: float) -> None:
    rho = 0.6
    lam = rho / S
    pk = rho * S * (1.0 + cv * cv) / (2.0 * (1.0 - rho))  # E[W] = λE[S²] / 2(1 − ρ)
    got = Pools([1], [lam], [S], [cv]).mean_response_s()[0]
    assert got == pytest.approx(S + pk, rel=1e-9)


@pytest.mark.parametrize("cv", [0.0, 0.5, 1.5])
def test_mean_wait_is_allen_cunneen_for_several(cv: float) -> None:
    c, rho = 8, 0.8
    lam = rho * c / S
    mmc = erlang_c(c, lam * S) / (c / S - lam)  # E[W] of M/M/c
    ac = mmc * (1.0 + cv * cv) / 2.0  # Allen–Cunneen, Poisson arrivals
    got = Pools([c], [lam], [S], [cv]).mean_response_s()[0]
    assert got == pytest.approx(S + ac, rel=1e-9)


def test_the_cdf_of_a_near_constant_service_is_a_narrow_gamma() -> None:
    """0 < cv < 0.1 (Wilson–Hilferty): the idle pool's median is the mean to 0.1 %, its p99
    about 2.33 cv above it."""
    pools = Pools([4], [0.0], [S], [0.05])
    assert pools.cdf(S)[0] == pytest.approx(0.5, abs=0.02)
    assert pools.quantile(0.99)[0] == pytest.approx(S * (1 + 2.33 * 0.05), rel=0.01)
