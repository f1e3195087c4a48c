"""Serving latency model: the response-time distribution of a pool of ``c`` replicas.

A request's response time is T = W + S: its wait in the pool's FCFS queue plus its own service.
Everything here is vectorised over pools (numpy arrays), so a simulation scores all its windows
at once.

* **M/M/c (exact).** Erlang C gives C(c, A) = P(W > 0) with A = λ/μ; given that it waits,
  W ~ Exp(θ) with θ = cμ − λ; S ~ Exp(μ) independent of W. The CDF of T is
  P(T ≤ t) = (1 − C)·F_S(t) + C·P(E_θ + E_μ ≤ t), the second term a hypoexponential in closed
  form; quantiles come from inverting it numerically (bisection). Formulas: research/
  contention.md §3.1 (Erlang C and its waiting tail, the standard results). This replaces the
  old p99(W) + p99(S), which overstated p99 by 7–45 % (issue 14: c=16, ρ=0.9, 40 ms: 211 ms
  exact vs 286 ms).
* **M/G/1 (exact, one replica with Poisson arrivals).** The waiting time from the
  Pollaczek–Khinchine transform, inverted numerically (``sim/mg1.py``); P(W > 0) = ρ. The
  approximation below was +5–7 % on the p99 at cv 0.5, ρ ≤ 0.7 (issue 33, item 11).
* **M/G/c (approximation, for service CV ≠ 1 or arrival CV ≠ 1).** Three choices:
  1. P(W > 0) ≈ C(c, A), the M/M/c value;
  2. W | W > 0 ~ Exp(θ') with θ' = (cμ − λ)·2/(c_a² + c_s²): the Allen–Cunneen two-moment mean
     wait E[W] ≈ E[W_M/M/c]·(c_a² + c_s²)/2 (contention.md §3.1), carried into the tail by
     scaling its decay rate (contention.md §4.4-2);
  3. S is gamma with the given mean and CV (the shape the issue's reference figures use): for
     0.1 ≤ c_s ≤ 1 as a mixture of Erlang(k−1) and Erlang(k) with a common rate (Tijms, "A
     First Course in Stochastic Models", the standard two-moment phase-type fit [R]; exactly
     gamma when 1/c_s² is an integer, e.g. c_s = 0.5), for c_s > 1 by the incomplete-gamma
     series, for 0 < c_s < 0.1 by the Wilson–Hilferty normal approximation, and c_s = 0 is a
     constant (W' + D: the exponential shifted; it was clipped to c_s = 0.1 before).
  T's CDF is then (1 − C)·F_S(t) + C·P(W' + S ≤ t), the convolution done by 24-point
  Gauss–Legendre quadrature. Measured against a request-level DES with gamma service
  (``bench/latency_model.py``; the figures are in bench/README.md): the p99 is within a few
  percent for c_s ∈ [0.5, 1.5] at ρ ≤ 0.95, and it reduces exactly to M/M/c at c_s = c_a = 1.

An overloaded pool (λ ≥ cμ, or no replica with λ > 0) has no steady state: its quantiles are
``inf`` and its CDF is 0 everywhere.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from gpufence.sim.mg1 import waiting_then_served_cdf

INF = float("inf")
MIN_CV = 0.1  # below this a service's gamma is approximated (Wilson–Hilferty); 0: constant
Arr = NDArray[np.float64]

_GL_X, _GL_W = np.polynomial.legendre.leggauss(24)
_GL_U = (_GL_X + 1.0) / 2.0  # nodes on [0, 1]
_GL_V = _GL_W / 2.0


def erlang_c(c: int, offered: float) -> float:
    """Probability that an arriving request has to wait (c servers, ``offered`` = λ/μ Erlangs)."""
    return float(erlang_c_array(np.array([c], float), np.array([offered], float))[0])


def erlang_c_array(c: Arr, offered: Arr) -> Arr:
    """Erlang C over arrays: iterative Erlang B (stable for large c), then converted."""
    c = np.asarray(c, float)
    a = np.asarray(offered, float)
    b = np.ones_like(a)
    top = int(c.max()) if c.size else 0
    for k in range(1, top + 1):
        step = k <= c
        b = np.where(step, a * b / (k + a * b), b)
    rho = np.divide(a, c, out=np.ones_like(a), where=c > 0)
    out = np.where(rho < 1.0, b / np.maximum(1.0 - rho + rho * b, 1e-300), 1.0)
    out = np.where(a <= 0, 0.0, out)
    return np.where(c <= 0, 1.0, out)


# ---------------------------------------------------------------- service distribution
def _phases(mean: Arr, cv: Arr) -> list[tuple[Arr, int, Arr]]:
    """Service time as a phase-type mixture ``[(weight, Erlang phases, rate)]`` per element
    (cv ≤ 1), the same list structure for every pool: weights are 0 where a term does not
    apply. cv = 1 is one exponential phase; 1/k ≤ cv² < 1/(k−1) mixes Erlang(k−1) and
    Erlang(k) with a common rate (exactly gamma when 1/cv² is an integer). cv > 1 is left to
    ``_gamma_cdf`` (weight 0 here)."""
    cv = np.clip(np.asarray(cv, float), MIN_CV, None)
    cv2 = cv * cv
    unit = np.isclose(cv2, 1.0)
    out: list[tuple[Arr, int, Arr]] = []
    if unit.any():
        out.append((unit.astype(float), 1, 1.0 / mean))
    low = (cv2 < 1.0) & ~unit
    if low.any():
        k = np.where(low, np.ceil(1.0 / cv2 - 1e-9), 2.0).astype(int)
        kf = k.astype(float)
        p = (kf * cv2 - np.sqrt(np.maximum(kf * (1.0 + cv2) - kf * kf * cv2, 0.0))) / (1.0 + cv2)
        p = np.clip(p, 0.0, 1.0)
        rate = (kf - p) / mean
        ks = {int(x) for x in k[low]}
        for j in sorted(ks | {x - 1 for x in ks}):
            if j < 1:
                continue
            w = np.where(low & (k == j), 1.0 - p, 0.0) + np.where(low & (k - 1 == j), p, 0.0)
            if w.any():
                out.append((w, j, rate))
    return out


def _gamma_cdf(shape: Arr, lgamma1: Arr, rate: Arr, t: Arr, terms: int = 90) -> Arr:
    """Regularised lower incomplete gamma P(shape, rate·t) for shape ≤ 1 (service cv ≥ 1), by
    its power series x^a e^{−x} Σ x^n / Γ(a + n + 1) (``lgamma1`` = ln Γ(a + 1)); x is clipped
    at 60, where 1 − P < 1e-24."""
    x = np.minimum(rate * t, 60.0)
    pos = x > 0
    xs = np.where(pos, x, 1.0)
    term = np.exp(shape * np.log(xs) - xs - lgamma1)
    acc = term.copy()
    for n in range(1, terms):
        term = term * xs / (shape + n)
        acc = acc + term
    return np.where(pos, np.minimum(acc, 1.0), 0.0)


def _erlang_sf(j: int, rate: Arr, t: Arr) -> Arr:
    """P(Erlang(j, rate) > t) = e^{−rt} Σ_{i<j} (rt)^i / i!."""
    x = rate * t
    term = np.ones_like(x)
    acc = np.ones_like(x)
    for i in range(1, j):
        term = term * x / i
        acc = acc + term
    out: Arr = np.exp(-x) * acc
    return out


def _hypo_cdf(theta: Arr, r: Arr, t: Arr) -> Arr:
    """P(Exp(θ) + Exp(r) ≤ t) in closed form (and its equal-rate limit where θ ≈ r)."""
    same = np.abs(theta - r) <= 1e-7 * np.maximum(theta, r)
    d = np.where(same, 1.0, r - theta)
    apart = (r * np.exp(-theta * t) - theta * np.exp(-r * t)) / d
    out: Arr = 1.0 - np.where(same, (1.0 + r * t) * np.exp(-r * t), apart)
    return out


def _normal_cdf(z: Arr) -> Arr:
    """Φ(z) by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), vectorised."""
    x = np.abs(z) / math.sqrt(2.0)
    k = 1.0 / (1.0 + 0.3275911 * x)
    poly = k * (
        0.254829592 + k * (-0.284496736 + k * (1.421413741 + k * (-1.453152027 + k * 1.061405429)))
    )
    erf = 1.0 - poly * np.exp(-x * x)
    out: Arr = 0.5 * (1.0 + np.sign(z) * erf)
    return out


class _Service:
    """Gamma-shaped service times (mean, cv) per pool: phases for 0.1 ≤ cv ≤ 1, a series for
    cv > 1, the Wilson–Hilferty normal approximation of the gamma for 0 < cv < 0.1 (shape >
    100, where it is within ~1e-4 of the CDF), and a constant for cv = 0. (cv below 0.1 was
    clipped to 0.1: a deterministic service was +24.7 % at c=64 ρ=0.7, issue 33 item 11.)"""

    def __init__(self, mean: Arr, cv: Arr) -> None:
        cv = np.maximum(np.asarray(cv, float), 0.0)
        self.mean = mean
        self.det = cv <= 0.0
        self.fine = (cv > 0.0) & (cv < MIN_CV)
        special = self.det | self.fine
        usual = np.where(special, 1.0, cv)
        self.phases = [(w * ~special, j, r) for w, j, r in _phases(mean, usual)]
        self.heavy = (usual * usual > 1.0) & ~np.isclose(usual * usual, 1.0)
        self.shape = np.where(self.heavy, 1.0 / (usual * usual), 1.0)
        self.rate = self.shape / mean
        self.lgamma1 = np.array([math.lgamma(a + 1.0) for a in self.shape.ravel()]).reshape(
            self.shape.shape
        )
        self.fine_shape = np.where(self.fine, 1.0 / np.maximum(cv * cv, 1e-300), 1.0)
        self.exp_only = ~self.heavy & ~special  # S is one exponential phase or a mixture
        for w, j, _ in self.phases:
            if j > 1:
                self.exp_only &= w == 0

    def cdf(self, t: Arr, axis: bool = False) -> Arr:
        """P(S ≤ t); ``axis``: ``t`` has one more (trailing) axis than the pools."""

        def e(x: NDArray[Any]) -> NDArray[Any]:
            return x[..., None] if axis else x

        out = np.zeros(t.shape)
        for w, j, r in self.phases:
            out = out + e(w) * (1.0 - _erlang_sf(j, e(r), t))
        if self.heavy.any():
            g = _gamma_cdf(e(self.shape), e(self.lgamma1), e(self.rate), t)
            out = np.where(e(self.heavy), g, out)
        if self.fine.any():  # Wilson–Hilferty: (X / E[X])^(1/3) ~ N(1 − 1/(9k), 1/(9k))
            k = e(self.fine_shape)
            ratio = np.cbrt(np.maximum(t, 0.0) / e(self.mean))
            z = (ratio - (1.0 - 1.0 / (9.0 * k))) / np.sqrt(1.0 / (9.0 * k))
            out = np.where(e(self.fine), _normal_cdf(z), out)
        if self.det.any():
            out = np.where(e(self.det), (t >= e(self.mean)).astype(float), out)
        return out

    def with_wait_cdf(self, theta: Arr, t: Arr) -> Arr:
        """P(Exp(θ) + S ≤ t): closed form where S is exponential or constant, quadrature
        elsewhere."""
        exp_only = self.exp_only
        out = np.zeros(theta.shape)
        for w, j, r in self.phases:
            if j == 1:
                out = out + w * _hypo_cdf(theta, r, t)
        if not exp_only.all():
            # ∫_0^t θe^{−θw} F_S(t − w) dw with u = 1 − e^{−θw}: a smooth integrand on [0, U]
            top = -np.expm1(-theta * t)
            u = top[..., None] * _GL_U
            rest = np.maximum(t[..., None] + np.log1p(-u) / theta[..., None], 0.0)
            quad = top * (self.cdf(rest, axis=True) @ _GL_V)
            out = np.where(exp_only, out, quad)
        if self.det.any():  # Exp(θ) + D: the exponential shifted by D
            late = np.maximum(t - self.mean, 0.0)
            out = np.where(self.det, -np.expm1(-theta * late), out)
        return out

    def transform(self, s: NDArray[np.complex128]) -> NDArray[np.complex128]:
        """S*(s) = E[e^{−sS}] per pool (``s`` has one more, trailing, axis than the pools)."""
        out = np.zeros(s.shape, complex)
        for w, j, r in self.phases:
            out = out + w[..., None] * (r[..., None] / (r[..., None] + s)) ** j
        for mask, shape, rate in (
            (self.heavy, self.shape, self.rate),
            (self.fine, self.fine_shape, self.fine_shape / self.mean),
        ):
            if mask.any():
                g = (rate[..., None] / (rate[..., None] + s)) ** shape[..., None]
                out = np.where(mask[..., None], g, out)
        if self.det.any():
            out = np.where(self.det[..., None], np.exp(-s * self.mean[..., None]), out)
        return out


# ---------------------------------------------------------------- the pool
class Pools:
    """``n`` replica pools (one per element): replicas, arrival rate (1/s), mean service (s),
    service CV and arrival CV. ``cdf(t)`` and ``quantile(q)`` work on all of them at once."""

    def __init__(
        self,
        replicas: ArrayLike,
        rate_rps: ArrayLike,
        service_s: ArrayLike,
        service_cv: ArrayLike = 1.0,
        arrival_cv: ArrayLike = 1.0,
    ) -> None:
        c, lam, s, cs, ca = np.broadcast_arrays(
            np.atleast_1d(np.asarray(replicas, float)),
            np.atleast_1d(np.asarray(rate_rps, float)),
            np.atleast_1d(np.asarray(service_s, float)),
            np.atleast_1d(np.asarray(service_cv, float)),
            np.atleast_1d(np.asarray(arrival_cv, float)),
        )
        self.c, self.rate, self.service = c.copy(), lam.copy(), np.maximum(s, 1e-12)
        mu = 1.0 / self.service
        self.overloaded = (lam > 0) & ((c <= 0) | (lam >= c * mu))
        ok = ~self.overloaded
        offered = np.where(ok, lam / mu, 0.0)
        self.wait_prob = np.where(ok, erlang_c_array(np.where(ok, c, 1.0), offered), 1.0)
        cs = np.maximum(cs, 0.0)
        self.service_cv, self.arrival_cv = cs, ca
        variability = np.maximum((ca * ca + cs * cs) / 2.0, 1e-9)
        self.theta = np.where(ok, np.maximum(c * mu - lam, 1e-12) / variability, 1.0)
        self.svc = _Service(self.service, cs)
        # one replica, Poisson arrivals: the exact M/G/1 wait (Pollaczek–Khinchine, sim/mg1.py)
        self.mg1 = np.flatnonzero(ok & (c == 1) & np.isclose(ca, 1.0) & (lam > 0))
        self.svc1 = _Service(self.service[self.mg1], cs[self.mg1])

    def __len__(self) -> int:
        return int(self.c.size)

    def subset(self, idx: NDArray[np.intp]) -> Pools:
        return Pools(
            self.c[idx],
            self.rate[idx],
            self.service[idx],
            self.service_cv[idx],
            self.arrival_cv[idx],
        )

    def cdf(self, t: ArrayLike) -> Arr:
        """P(T ≤ t) per pool (``t`` scalar or one value per pool)."""
        tt = np.broadcast_to(np.asarray(t, float), self.c.shape).astype(float)
        tt = np.maximum(tt, 0.0)
        fs = self.svc.cdf(tt)
        fw = self.svc.with_wait_cdf(self.theta, tt)
        if self.mg1.size:
            i = self.mg1
            det = np.where(self.svc1.det, self.service[i], np.nan)
            fw = fw.copy()
            fw[i] = waiting_then_served_cdf(
                self.rate[i], self.wait_prob[i], self.svc1.transform, tt[i], det
            )
        out = (1.0 - self.wait_prob) * fs + self.wait_prob * fw
        return np.where(self.overloaded, 0.0, np.clip(out, 0.0, 1.0))

    def mean_response_s(self) -> Arr:
        mean = self.service + self.wait_prob / self.theta
        return np.where(self.overloaded, INF, mean)

    def quantile(self, q: float = 0.99, rel_tol: float = 1e-6) -> Arr:
        """The q-quantile of T per pool (inf where overloaded), by bisection on the CDF."""
        lo = np.zeros(self.c.shape)
        hi = np.where(self.overloaded, 1.0, self.mean_response_s())
        hi = np.maximum(hi, self.service)
        for _ in range(200):  # bracket: double until the CDF passes q
            short = (self.cdf(hi) < q) & ~self.overloaded
            if not short.any():
                break
            hi = np.where(short, hi * 2.0, hi)
        iters = math.ceil(math.log2(1.0 / rel_tol)) + 1
        for _ in range(iters):
            mid = (lo + hi) / 2.0
            below = self.cdf(mid) < q
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        return np.where(self.overloaded, INF, hi)


def mixture_quantile(pools: Pools, weights: ArrayLike, q: float = 0.99) -> float:
    """The q-quantile of the response time of a request drawn from the pools with ``weights``
    (requests per window): one distribution for a whole run. inf when more than 1 − q of the
    requests meet an overloaded pool."""
    w = np.asarray(weights, float)
    total = float(w.sum())
    if total <= 0 or len(pools) == 0:
        return 0.0
    share = w / total
    if float(share[pools.overloaded].sum()) > 1.0 - q + 1e-12:
        return INF
    ok = ~pools.overloaded & (w > 0)
    hi = float(np.max(pools.quantile(q)[ok])) if ok.any() else 0.0
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if float(share @ pools.cdf(mid)) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-7 * max(hi, 1e-9):
            break
    return hi


def _grouped(owner: ArrayLike, weight: ArrayLike, groups: int) -> tuple[NDArray[np.intp], Arr, Arr]:
    """Group index per pool, the weights (equal within a group whose weights are all 0), and
    each group's total weight."""
    own = np.asarray(owner, np.intp)
    w = np.asarray(weight, float)
    den = np.bincount(own, weights=w, minlength=groups)
    w = np.where(den[own] > 0, w, 1.0).astype(float)
    total: Arr = np.bincount(own, weights=w, minlength=groups).astype(float)
    return own, w, total


def window_shares(pools: Pools, owner: ArrayLike, weight: ArrayLike, groups: int, t: float) -> Arr:
    """Per group of pools (``owner[i]`` the group of pool i, ``weight[i]`` its requests): the
    share of the group's requests answered within ``t``."""
    own, w, den = _grouped(owner, weight, groups)
    return np.bincount(own, weights=w * pools.cdf(t), minlength=groups) / den


def window_quantiles(
    pools: Pools, owner: ArrayLike, weight: ArrayLike, groups: int, q: float = 0.99
) -> Arr:
    """Per group of pools (``owner`` ascending), the q-quantile of a request drawn from its
    pools by ``weight``: a pool's own quantile where the group is one pool, else the
    mixture's, by bisection on its CDF (inf when more than 1 − q of it is overloaded)."""
    own, w, den = _grouped(owner, weight, groups)
    per = pools.quantile(q)
    count = np.bincount(own, minlength=groups)
    first = np.searchsorted(own, np.arange(groups))
    out = np.where(count == 1, per[np.minimum(first, len(per) - 1)], 0.0)
    multi = count > 1
    if not multi.any():
        return out
    idx = np.flatnonzero(multi[own])
    sub, so, sw = pools.subset(idx), own[idx], w[idx]
    over = np.bincount(so, weights=sw * sub.overloaded, minlength=groups) / np.maximum(den, 1e-300)
    hi = np.zeros(groups)
    np.maximum.at(hi, so, np.where(sub.overloaded, 0.0, per[idx]))
    lo = np.zeros(groups)
    for _ in range(60):
        mid = (lo + hi) / 2.0
        got = np.bincount(so, weights=sw * sub.cdf(mid[so]), minlength=groups) / den
        below = got < q
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    mixed = np.where(over > 1.0 - q + 1e-12, INF, hi)
    return np.where(multi, mixed, out)


# ---------------------------------------------------------------- scalar helpers
def p99_response_s(
    replicas: int,
    rate_rps: float,
    service_s: float,
    service_cv: float = 1.0,
    arrival_cv: float = 1.0,
    quantile: float = 0.99,
) -> float:
    """q-quantile of response time (s) for ``replicas`` servers; inf when overloaded."""
    pools = Pools([replicas], [rate_rps], [service_s], [service_cv], [arrival_cv])
    return float(pools.quantile(quantile)[0])


def meets_slo(
    replicas: int,
    rate_rps: float,
    service_s: float,
    slo_s: float,
    service_cv: float = 1.0,
    arrival_cv: float = 1.0,
    quantile: float = 0.99,
) -> bool:
    """p-quantile of T within ``slo_s`` ⟺ P(T ≤ slo) ≥ p (one CDF evaluation, no inversion)."""
    pools = Pools([replicas], [rate_rps], [service_s], [service_cv], [arrival_cv])
    return bool(pools.cdf(slo_s)[0] >= quantile - 1e-12)


def replicas_for_slo(
    rate_rps: float,
    service_s: float,
    slo_s: float,
    service_cv: float = 1.0,
    arrival_cv: float = 1.0,
    max_replicas: int = 100_000,
    quantile: float = 0.99,
) -> int | None:
    """Fewest replicas keeping the p-quantile of response time within ``slo_s``; None if no
    count can (the service alone is slower than the SLO at that quantile)."""
    if not meets_slo(1, 0.0, service_s, slo_s, service_cv, arrival_cv, quantile):
        return None  # even an idle pool is too slow
    if rate_rps <= 0:
        return 1
    offered = rate_rps * service_s
    lo = max(1, math.floor(offered) + 1)  # stability: c > A
    # p99 falls as c grows; the SLO holds from some c on: find it by doubling, then bisection
    hi = lo
    while not meets_slo(hi, rate_rps, service_s, slo_s, service_cv, arrival_cv, quantile):
        if hi >= max_replicas:
            return None
        hi = min(max_replicas, hi * 2)
    while lo < hi:
        mid = (lo + hi) // 2
        if meets_slo(mid, rate_rps, service_s, slo_s, service_cv, arrival_cv, quantile):
            hi = mid
        else:
            lo = mid + 1
    return lo
