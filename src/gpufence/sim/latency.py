"""Serving latency model: Erlang C with a two-moment (G/G/c) correction, p99 response time.

Formulas and their sources are in research/contention.md §3.1 and §4.4:
  * M/M/c (Erlang C): C(c, A) is the probability a request waits, A = λ/μ offered load;
    P(W > t) = C · exp(-(cμ − λ) t), so the p-quantile of waiting is ln(C / (1 − p)) / (cμ − λ).
  * G/G/c (Allen–Cunneen): E[W] ≈ E[W_M/M/c] · (c_a² + c_s²) / 2; we scale the tail's decay rate
    by 2 / (c_a² + c_s²) so the mean stays consistent with that formula [I, contention.md §4.4-2].
  * p99 response ≈ p99 wait + p99 service; service is modelled as exponential-ish with the
    given coefficient of variation, so its p99 ≈ mean · (1 + 3.6 · cv) (≈ −ln(0.01) · mean at cv=1).
"""

from __future__ import annotations

import math

INF = float("inf")


def erlang_c(c: int, offered: float) -> float:
    """Probability that an arriving request has to wait (c servers, ``offered`` = λ/μ Erlangs)."""
    if c <= 0:
        return 1.0
    if offered <= 0:
        return 0.0
    if offered >= c:
        return 1.0
    # iterative Erlang B, then convert: numerically stable for large c
    b = 1.0
    for k in range(1, c + 1):
        b = offered * b / (k + offered * b)
    rho = offered / c
    return b / (1.0 - rho + rho * b)


def p99_response_s(
    replicas: int,
    rate_rps: float,
    service_s: float,
    service_cv: float = 1.0,
    arrival_cv: float = 1.0,
    quantile: float = 0.99,
) -> float:
    """p-quantile of response time (s) for ``replicas`` servers; inf when overloaded."""
    if rate_rps <= 0:
        return service_s * (1.0 + 3.6 * service_cv)
    if replicas <= 0 or service_s <= 0:
        return INF
    mu = 1.0 / service_s
    if rate_rps >= replicas * mu:
        return INF
    offered = rate_rps / mu
    wait_prob = erlang_c(replicas, offered)
    variability = (arrival_cv**2 + service_cv**2) / 2.0
    decay = (replicas * mu - rate_rps) / max(variability, 1e-9)
    tail = 1.0 - quantile
    wait = math.log(wait_prob / tail) / decay if wait_prob > tail else 0.0
    return wait + service_s * (1.0 + 3.6 * service_cv)


def replicas_for_slo(
    rate_rps: float,
    service_s: float,
    slo_s: float,
    service_cv: float = 1.0,
    arrival_cv: float = 1.0,
    max_replicas: int = 100_000,
) -> int | None:
    """Fewest replicas keeping the p99 response within ``slo_s``; None if no count can."""
    if service_s * (1.0 + 3.6 * service_cv) > slo_s:
        return None  # even an idle replica is too slow
    lo = max(1, math.floor(rate_rps * service_s) + 1)
    # square-root staffing as the first guess, then walk up (the tail is steep near ρ = 1)
    c = max(lo, math.ceil(rate_rps * service_s + math.sqrt(max(rate_rps * service_s, 0.0))))
    while c > lo and p99_response_s(c - 1, rate_rps, service_s, service_cv, arrival_cv) <= slo_s:
        c -= 1
    while p99_response_s(c, rate_rps, service_s, service_cv, arrival_cv) > slo_s:
        c += 1
        if c > max_replicas:
            return None
    return c
