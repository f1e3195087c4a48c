"""Serving latency per deployment: the sliding-window p99 and SLO attainment of the latency book
(``control/observe/latency_book.py``) on known data, and the scraper
(``latency_scrape.py``) reading a real replica's ``prometheus_client`` histogram over HTTP on
127.0.0.1 (baseline, increases, a counter reset, the host fence, errors in words)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from gpufence.control.observe.latency_book import DeploymentKey, LatencyBook
from gpufence.control.observe.latency_scrape import LatencySource, Scraper, pick_histogram
from gpufence.telemetry import histograms as hist

KEY = DeploymentKey("team-a", "api")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _book(clock: Clock, window_s: float = 60.0) -> LatencyBook:
    return LatencyBook(step_s=5.0, window_s=window_s, retention_s=600.0, clock=clock)


def test_p99_covers_the_sliding_window_only() -> None:
    clock = Clock()
    book = _book(clock)
    book.add(KEY, "serve", 0.1, hist.binned([0.5] * 100))  # a slow minute...
    clock.t += 120.0
    book.add(KEY, "serve", 0.1, hist.binned([0.01] * 100))  # ...two minutes ago
    (s,) = book.summaries()
    assert s.p99_s is not None and s.p99_s == pytest.approx(0.01, rel=0.1)
    assert s.window_requests == 100
    assert s.requests_total == 200 and s.slow_total == pytest.approx(100)
    clock.t -= 100.0  # seen from when the slow requests were in the window
    (s,) = book.summaries()
    assert s.p99_s == pytest.approx(0.5, rel=0.1)


def test_attainment_is_the_request_weighted_share_of_windows_meeting_the_slo() -> None:
    clock = Clock()
    book = _book(clock)
    for fast, slow in ((300, 0), (300, 0), (100, 50)):  # three 60 s scoring windows
        book.add(KEY, "serve", 0.1, hist.binned([0.02] * fast + [0.4] * slow), score_s=60.0)
        clock.t += 60.0
    (s,) = book.summaries()
    assert s.attainment == pytest.approx(600 / 750)  # the third window's p99 missed
    other = DeploymentKey("team-b", "noslo")
    book.add(other, "serve", None, hist.binned([0.02] * 10))
    by_key = {x.key: x for x in book.summaries()}
    assert by_key[other].attainment is None and by_key[other].slo_s is None


def test_a_quiet_deployment_is_forgotten_after_the_retention() -> None:
    clock = Clock()
    book = _book(clock)
    book.add(KEY, "serve", 0.1, hist.binned([0.02]))
    assert book.take_fresh() == {KEY: 1.0}
    assert book.take_fresh() == {}
    clock.t += 600.0 + 5.0  # the retention and the step the requests came in
    assert book.summaries() == []


# ---------------------------------------------------------------------------- the scraper


class Replica:
    """A replica exposing ``api_request_duration_seconds`` on 127.0.0.1 like a real server."""

    def __init__(self) -> None:
        self.restart()
        self.status = 200
        replica = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = generate_latest(replica.registry)
                self.send_response(replica.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def restart(self) -> None:
        self.registry = CollectorRegistry()
        self.hist = Histogram(
            "api_request_duration_seconds",
            "request latency",
            ["route"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=self.registry,
        )

    def serve(self, latency_s: float, n: int, route: str = "/v1/complete") -> None:
        for _ in range(n):
            self.hist.labels(route).observe(latency_s)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def replica() -> Iterator[Replica]:
    r = Replica()
    yield r
    r.close()


def _source(url: str, attempt: int = 1) -> LatencySource:
    return LatencySource("job-1", attempt, KEY, "serve", 0.05, None, url)


def test_scraping_counts_the_requests_between_two_scrapes(replica: Replica) -> None:
    clock = Clock()
    book = _book(clock)
    scraper = Scraper(book, timeout_s=2.0)
    replica.serve(0.3, 500)  # served before gpufence looked: not "now"
    scraper.scrape([_source(replica.url)])
    assert scraper.status == {"job-1": (True, "")}
    assert book.summaries() == []
    replica.serve(0.02, 90)
    replica.serve(0.07, 6, route="/v1/embed")  # summed over label sets
    replica.serve(0.4, 4)
    clock.t += 5.0
    scraper.scrape([_source(replica.url)])
    (s,) = book.summaries()
    assert s.window_requests == 100
    assert s.p99_s is not None and 0.25 <= s.p99_s <= 0.5  # the 4 slow ones are the top 4 %
    assert s.slow_total == pytest.approx(10, abs=1.0)  # over 50 ms: 6 at 70 ms and 4 at 400 ms


def test_a_counter_reset_counts_everything_since_the_reset(replica: Replica) -> None:
    book = _book(Clock())
    scraper = Scraper(book, timeout_s=2.0)
    replica.serve(0.02, 50)
    scraper.scrape([_source(replica.url)])  # baseline
    replica.serve(0.02, 10)
    scraper.scrape([_source(replica.url)])
    replica.restart()  # the replica's process restarted: its counters start from 0
    replica.serve(0.02, 7)
    scraper.scrape([_source(replica.url)])
    (s,) = book.summaries()
    assert s.requests_total == 10 + 7


def test_scrape_errors_are_words_and_the_host_is_fenced(replica: Replica) -> None:
    book = _book(Clock())
    scraper = Scraper(book, timeout_s=2.0)
    far = LatencySource("job-2", 1, KEY, "serve", None, None, "http://10.9.8.7:9000/metrics")
    replica.status = 500
    scraper.scrape([_source(replica.url), far])
    up, err = scraper.status["job-1"]
    assert not up and err.endswith("HTTP 500")
    assert scraper.status["job-2"] == (
        False,
        "host 10.9.8.7 is not loopback nor in control.telemetry.scrape_hosts",
    )
    replica.status = 200
    empty = Replica()
    try:
        scraper.scrape([_source(empty.url)])
        assert "has no histogram *_request_duration_seconds" in scraper.status["job-1"][1]
    finally:
        empty.close()
    scraper.scrape([])
    assert scraper.status == {}  # ended replicas are forgotten


def test_pick_histogram_by_name_and_unit() -> None:
    text = (
        "# TYPE rpc_latency_milliseconds histogram\n"
        'rpc_latency_milliseconds_bucket{le="10.0"} 3\n'
        'rpc_latency_milliseconds_bucket{le="100.0"} 4\n'
        'rpc_latency_milliseconds_bucket{le="+Inf"} 4\n'
        "rpc_latency_milliseconds_count 4\n"
        "rpc_latency_milliseconds_sum 50\n"
    )
    assert pick_histogram(text, None) is None  # not *_request_duration_seconds
    found = pick_histogram(text, "rpc_latency_milliseconds")
    assert found is not None
    name, (bounds, counts) = found
    assert name == "rpc_latency_milliseconds"
    assert bounds == pytest.approx((0.01, 0.1)) and counts == (3.0, 1.0, 0.0)
