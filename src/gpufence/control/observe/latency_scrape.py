"""Scraping a serving replica's own Prometheus histogram for the latency book.

A serving job declares ``metrics_url`` (or ``metrics_port``: ``http://<its node>:PORT/metrics``)
and optionally ``latency_metric``. Every series step the control plane GETs each running
replica's endpoint, parses the text format with ``prometheus_client``'s parser, and takes the
histogram named ``latency_metric`` — else the first (by name) whose name ends in
``request_duration_seconds`` — summed over its label sets (routes, status codes). Its requests
since the previous scrape (the difference of the cumulative buckets; after a counter reset,
everything since the reset, as Prometheus' ``rate()`` does) go into the book. The first scrape
of a replica is only a baseline: what it served before is not counted as "now".

The request leaves from the server, so it is fenced: http(s) only, the host loopback or listed
in ``control.telemetry.scrape_hosts``, no proxy, no redirect, at most ``MAX_BODY`` bytes, within
``scrape_timeout_s``. Errors are kept per replica in words that repeat nothing of the answer.
"""

from __future__ import annotations

import ipaddress
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from gpufence.control.observe.latency_book import DeploymentKey, LatencyBook
from gpufence.telemetry import histograms as hist

log = logging.getLogger("gpufence.observe")
MAX_BODY = 8 << 20
DEFAULT_SUFFIX = "request_duration_seconds"
_UNIT_SCALE = (("_milliseconds", 1e-3), ("_ms", 1e-3), ("_microseconds", 1e-6))


@dataclass(frozen=True, slots=True)
class LatencySource:
    """Where one running replica's latency is read."""

    job_id: str
    attempt: int
    key: DeploymentKey
    partition: str
    slo_s: float | None
    score_s: float | None
    url: str
    metric: str | None = None


Fetch = Callable[[str, float], str]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # a 3xx becomes an HTTPError: a replica's /metrics does not move


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def fetch_text(url: str, timeout_s: float) -> str:
    with _OPENER.open(url, timeout=timeout_s) as resp:
        body: bytes = resp.read(MAX_BODY + 1)
    if len(body) > MAX_BODY:
        raise ValueError(f"answer larger than {MAX_BODY >> 20} MiB")
    return body.decode("utf-8", errors="replace")


def host_allowed(url: str, allowed: Iterable[str]) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost" or host in set(allowed):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def pick_histogram(text: str, metric: str | None) -> tuple[str, hist.Histogram] | None:
    """(family name, histogram in seconds) of the latency histogram in a scrape, or None."""
    families = [f for f in text_string_to_metric_families(text) if f.type == "histogram"]
    if metric is not None:
        chosen = [f for f in families if metric in (f.name, f.name + "_seconds")]
    else:
        chosen = sorted(
            (f for f in families if f.name.endswith(DEFAULT_SUFFIX)), key=lambda f: f.name
        )
    if not chosen:
        return None
    fam = chosen[0]
    scale = next((k for s, k in _UNIT_SCALE if fam.name.endswith(s)), 1.0)
    by_le: dict[float, float] = {}
    for s in fam.samples:
        if s.name == fam.name + "_bucket" and "le" in s.labels:
            le = float(s.labels["le"])
            by_le[le] = by_le.get(le, 0.0) + float(s.value)
    les = sorted(by_le)
    if not les:
        return None
    bounds, counts = hist.from_cumulative(les, [by_le[le] for le in les])
    return fam.name, (tuple(b * scale for b in bounds), counts)


def _increase(prev: hist.Histogram, cur: hist.Histogram) -> hist.Histogram:
    """Requests between two scrapes; after a reset (fewer requests), all of the current ones."""
    if any(c < p for c, p in zip(cur[1], prev[1], strict=True)):
        return cur
    return cur[0], tuple(c - p for c, p in zip(cur[1], prev[1], strict=True))


class Scraper:
    """Scrapes sources into the book; ``status`` says, per job id, whether the last one worked."""

    def __init__(
        self,
        book: LatencyBook,
        timeout_s: float,
        allowed_hosts: Sequence[str] = (),
        fetch: Fetch = fetch_text,
    ) -> None:
        self.book = book
        self.timeout_s = timeout_s
        self.allowed_hosts = tuple(allowed_hosts)
        self.fetch = fetch
        self._prev: dict[tuple[str, int, str], hist.Histogram] = {}
        self.status: dict[str, tuple[bool, str]] = {}  # job id -> (up, error)

    def scrape(self, sources: Sequence[LatencySource]) -> None:
        live = {(s.job_id, s.attempt, s.url) for s in sources}
        for k in [k for k in self._prev if k not in live]:
            del self._prev[k]  # ended replicas
        self.status = {j: v for j, v in self.status.items() if j in {s.job_id for s in sources}}
        for src in sources:
            err = self._one(src)
            self.status[src.job_id] = (err is None, err or "")
            if err is not None:
                log.info("latency of job %s not read: %s", src.job_id, err)

    def _one(self, src: LatencySource) -> str | None:
        if not host_allowed(src.url, self.allowed_hosts):
            host = urlsplit(src.url).hostname
            return f"host {host} is not loopback nor in control.telemetry.scrape_hosts"
        try:
            text = self.fetch(src.url, self.timeout_s)
        except urllib.error.HTTPError as exc:
            return f"GET {src.url}: HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            return f"GET {src.url}: {type(exc).__name__}"
        try:
            found = pick_histogram(text, src.metric)
        except ValueError:
            return f"{src.url} did not answer in the Prometheus text format"
        if found is None:
            want = src.metric or f"*_{DEFAULT_SUFFIX}"
            return f"{src.url} has no histogram {want} (set latency_metric)"
        key = (src.job_id, src.attempt, src.url)
        prev, cur = self._prev.get(key), found[1]
        self._prev[key] = cur
        if prev is None or prev[0] != cur[0]:
            return None  # a baseline (first scrape, or the buckets changed)
        inc = _increase(prev, cur)
        if hist.requests(inc) > 0:
            self.book.add(src.key, src.partition, src.slo_s, inc, score_s=src.score_s)
        return None
