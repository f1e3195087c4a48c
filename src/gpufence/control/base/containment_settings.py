"""The ``control.containment`` section of the config file.

```yaml
control:
  containment:
    mode: auto                 # auto | v2 | v1: which cgroup interface (auto: v2 if it has
                               #   the cpu, memory and pids controllers, else v1)
    cgroup_parent: /gpufence   # member cgroups live under it, in every hierarchy
    fake_gpu_devices: /dev/gpufence-fake{index}   # --fake-gpus: device node of fake GPU N
    prestarted: 8              # members kept forked and in a spare cgroup (v1), 0: none
```

The default process limit of a member is not set here: it is ``control.job_pids_limit`` (one
setting for every executor; ``launches.launch_for`` puts it in each ``Launch.limits``), which the
config copies into ``ContainmentSettings.pids_max`` for the launches that carry none and for the
pre-started spare cgroups, so a typical start writes no ``pids.max`` of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_PARENT = "/gpufence"
DEFAULT_PIDS_LIMIT = 16384
"""Processes + threads per gang member unless ``control.job_pids_limit`` says otherwise."""
DEFAULT_PRESTARTED = 8
"""Enough for a whole 8-GPU machine's worth of jobs starting at once."""
_PARENT_RE = re.compile(r"^(/[A-Za-z0-9_.-]+)+$")


@dataclass(frozen=True, slots=True)
class ContainmentSettings:
    mode: str = "auto"
    cgroup_parent: str = DEFAULT_PARENT
    pids_max: int | None = DEFAULT_PIDS_LIMIT
    """``control.job_pids_limit``: per member when its launch gives none; None: no limit."""
    fake_gpu_devices: str | None = None
    prestarted: int = DEFAULT_PRESTARTED

    def fake_device(self, index: int) -> str | None:
        return self.fake_gpu_devices.format(index=index) if self.fake_gpu_devices else None


class ContainmentSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["auto", "v2", "v1"] = "auto"
    cgroup_parent: str = DEFAULT_PARENT
    fake_gpu_devices: str | None = None
    prestarted: int = Field(default=DEFAULT_PRESTARTED, ge=0, le=64)

    @field_validator("cgroup_parent")
    @classmethod
    def _parent(cls, v: str) -> str:
        if not _PARENT_RE.match(v) or any(p in (".", "..") for p in v.split("/")):
            raise ValueError(
                "must be an absolute cgroup path of plain names, e.g. /gpufence or /system/jobs"
            )
        return v

    @field_validator("fake_gpu_devices")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("/") or "{index}" not in v):
            raise ValueError(
                "must be an absolute path with {index}, e.g. /dev/gpufence-fake{index}"
            )
        if v is not None:
            try:
                v.format(index=0)
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"only {{index}} may be substituted ({exc})") from None
        return v

    def settings(self, pids_max: int | None = DEFAULT_PIDS_LIMIT) -> ContainmentSettings:
        """The runtime settings; ``pids_max`` is ``control.job_pids_limit``."""
        return ContainmentSettings(
            self.mode, self.cgroup_parent, pids_max, self.fake_gpu_devices, self.prestarted
        )
