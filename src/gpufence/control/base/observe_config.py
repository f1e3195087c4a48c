"""The ``control.telemetry`` section: how the control plane observes itself.

```yaml
control:
  telemetry:
    series_step_s: 5            # one point of GET /v1/series (and one latency scrape) per step
    series_retention_s: 3600    # how far back the in-memory series reach (not kept at restart)
    latency_window_s: 300       # serving p99 over this sliding window (Prometheus' [5m])
    scrape_timeout_s: 2         # a replica's /metrics must answer within this
    scrape_hosts: [10.0.0.12]   # hosts a --metrics-url may name besides loopback
    net_devices: [eth0, ib0]    # NICs to count (default: every device in /sys/class/net)
    dcgm_job_mapping_dir: /var/lib/dcgm-exporter/job-mapping   # write dcgm-exporter's files
```
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TelemetrySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    series_step_s: float = Field(default=5.0, gt=0.0, le=3600.0)
    series_retention_s: float = Field(default=3600.0, gt=0.0, le=7 * 86400.0)
    latency_window_s: float = Field(default=300.0, gt=0.0, le=86400.0)
    scrape_timeout_s: float = Field(default=2.0, gt=0.0, le=60.0)
    scrape_hosts: tuple[str, ...] = ()
    net_devices: tuple[str, ...] | None = None
    dcgm_job_mapping_dir: str | None = Field(default=None, min_length=1)
    metrics_auth: Literal["open", "admin"] = "open"
    """``/metrics`` names tenants, queues and jobs. ``open`` (as scrapers expect) on a machine
    whose users may all see that; ``admin`` asks for the admin token (Prometheus:
    ``authorization: {credentials_file: DATA/admin.token}``)."""

    @model_validator(mode="after")
    def _sizes(self) -> TelemetrySettings:
        if self.series_retention_s < self.series_step_s:
            raise ValueError(
                f"series_retention_s ({self.series_retention_s:g}) is shorter than one "
                f"series_step_s ({self.series_step_s:g}); raise series_retention_s"
            )
        if self.series_retention_s / self.series_step_s > 100_000:
            raise ValueError(
                "series_retention_s / series_step_s is over 100000 points per series; "
                "raise series_step_s or lower series_retention_s"
            )
        return self

    @property
    def points(self) -> int:
        """Points the series ring keeps."""
        return max(1, round(self.series_retention_s / self.series_step_s))
