"""What a user submits to the control plane, validated, and its translation to a core ``Job``.

Validation that needs no cluster happens here and becomes a 422 naming the field. The rules, so
that nothing a client sends can reach the store or the scheduler in a shape they cannot handle:

* every number is finite (JSON ``1e400`` parses as infinity, ``NaN`` as NaN: both refused) and
  within the range its ``Field`` documents;
* every string is valid UTF-8 (no lone surrogates such as ``"\\ud800"``) and has no NUL; names
  (``name``, ``partition``, ``queue``, ``mig``, ``tenant``) and ``cwd`` have no control
  characters at all, argv items and env values may hold tab / newline / carriage return only;
* env keys full-match ``[A-Za-z_][A-Za-z0-9_]*`` (a trailing newline does not pass);
* ``command[0]`` is not empty; ``cwd`` is absolute; list and string sizes are bounded.

Whether the cluster can ever hold the job is the scheduler's intake check, which rejects at
submit with the reason. ``escape`` makes user text safe for a log line.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gpufence.control.base.arrays import ArraySpecError, parse_array
from gpufence.model.job import AfterKind, GpuRequest, Job, WorkloadClass

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")  # used with fullmatch
# Variables the executor sets; a user value would break GPU isolation or the handshake.
RESERVED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
)
MIB = 1 << 20
MAX_CPUS = 4096.0
MAX_MEM_BYTES = 1 << 50  # 1 PiB
MIN_LOG_LIMIT = 4096  # = logcap.MIN_LIMIT
MAX_LOG_LIMIT = 1 << 40
MAX_TIME_LIMIT_S = 366 * 86400.0

MAX_ARGS = 4096
MAX_ARG_BYTES = 128 * 1024  # Linux refuses a longer single argv string (MAX_ARG_STRLEN)
MAX_ENV = 1024
MAX_NAME = 128
MAX_PATH = 4096
MAX_RUNTIME_S = 10 * 366 * 86400.0  # ten years: beyond any estimate, far below float trouble
DEFAULT_PTY_GRACE_S = 60.0
"""How long a pty job outlives its last client (`run --pty --grace` changes it)."""
MAX_PTY_GRACE_S = 7 * 86400.0
MAX_GPU_MEM_GIB = 4096.0

# C0 controls, DEL and C1 controls; tab, newline and carriage return are told apart below
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# what is invisible or moves text in a terminal or a log viewer: line and paragraph separators,
# zero-width characters, bidirectional overrides and isolates (U+202E shows 'exe.txt' as
# 'txt.exe'), the BOM
_INVISIBLE = re.compile(r"[\u2028\u2029\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")
_CONTROL_NOT_WS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")

# The same rules as JSON Schema patterns for the OpenAPI document (what a client or a fuzzer
# reads: a request the document calls valid must not be refused for its text). Names are
# documented as their ASCII subset: the rest of what ``_readable`` lets through (visible,
# composed, assigned) is no regular expression.
NO_CONTROL_PATTERN = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
ARG_PATTERN = "^[^\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f-\\u009f]*$"
NAME_PATTERN = "^[!-.0-~]([ -.0-~]*[!-.0-~])?$"
LABEL_PATTERN = "^$|" + NAME_PATTERN
JOB_NAME_PATTERN = "^[!-+\\--.0-~]([ -+\\--.0-~]*[!-+\\--.0-~])?$"  # and no ','
ENV_NAME_PATTERN = "^[A-Za-z_][A-Za-z0-9_]{0,255}$"
METRICS_URL_PATTERN = "^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[!-~]*)?$"
METRIC_NAME_PATTERN = "^[a-zA-Z_:][a-zA-Z0-9_:]*$"
_ARRAY_ITEM = "[0-9]{1,6}(-[0-9]{1,6}(:[0-9]{1,6})?)?"
ARRAY_PATTERN = f"^{_ARRAY_ITEM}(,{_ARRAY_ITEM})*(%[0-9]{{1,5}})?$"
ABS_PATH_PATTERN = "^/[^\\u0000-\\u001f\\u007f-\\u009f]*$"


def _pattern(regex: str) -> Any:
    """Schema-only ``pattern`` (the validators above say what is wrong, by position)."""
    return Field(json_schema_extra={"pattern": regex})


def _utf8(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start]
        raise ValueError(
            f"is not valid UTF-8: lone surrogate U+{ord(bad):04X} at position {exc.start}"
        ) from None
    return value


def _refuse(pattern: re.Pattern[str], value: str, what: str) -> None:
    """``ValueError`` naming the first character of ``value`` that ``pattern`` finds."""
    m = pattern.search(value)
    if m is not None:
        raise ValueError(f"contains the {what} U+{ord(m.group()):04X} at position {m.start()}")


def _no_control(value: str) -> str:
    """A name or a path: valid UTF-8, no control character at all."""
    _utf8(value)
    _refuse(_CONTROL, value, "control character")
    return value


def _name_text(value: str) -> str:
    """A job name, partition, queue or dependency: as a path, and also not empty, no '/' (it
    is a path segment of the API's URLs) and nothing invisible (a name is read by people)."""
    _no_control(value)
    if not value.strip():
        raise ValueError("must not be empty or only spaces")
    if value != value.strip():
        raise ValueError("must not start or end with a space")
    if "/" in value or value in (".", ".."):
        raise ValueError("cannot contain '/' or be '.' or '..' (names are parts of URLs)")
    if not value.isascii():
        _readable(value)
    return value


# Hangul and braille fillers (letters by category, blank on screen)
_FILLERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def _readable(value: str) -> None:
    """Non-ASCII names: what people read is what is stored -- composed (NFC), no format,
    private-use, unassigned or separator characters but the plain space, no fillers or
    variation selectors (a name that looks blank, or like another)."""
    if unicodedata.normalize("NFC", value) != value:
        raise ValueError("must be in composed form (Unicode NFC): e.g. 'é', not 'e' + U+0301")
    for i, c in enumerate(value):
        cat = unicodedata.category(c)
        hidden = cat in ("Cf", "Co", "Cn", "Cs", "Zl", "Zp") or (cat == "Zs" and c != " ")
        selector = "\ufe00" <= c <= "\ufe0f" or "\U000e0100" <= c <= "\U000e01ef"
        if hidden or selector or c in _FILLERS:
            raise ValueError(f"contains the invisible character U+{ord(c):04X} at position {i}")


def _label_text(value: str) -> str:
    """A partition or queue: a name, or "" for the default one."""
    return _name_text(value) if value else value


def _arg_text(value: str) -> str:
    """An argv item or env value: valid UTF-8, no NUL; tab/newline/CR allowed (scripts)."""
    _utf8(value)
    if "\x00" in value:
        raise ValueError(f"contains a NUL byte at position {value.index(chr(0))}")
    _refuse(_CONTROL_NOT_WS, value, "control character")
    if len(value.encode("utf-8")) > MAX_ARG_BYTES:
        raise ValueError(f"is longer than {MAX_ARG_BYTES} bytes")
    return value


def _abs_path(value: str) -> str:
    _no_control(value)
    if not value.startswith("/"):
        raise ValueError("must be an absolute path (start with /)")
    return value


Name = Annotated[
    str, Field(max_length=MAX_NAME), _pattern(NAME_PATTERN), AfterValidator(_name_text)
]
MAX_DEPENDENCIES = 100
JobRef = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME),
    _pattern(NAME_PATTERN),
    AfterValidator(_name_text),
]
"""A job id (``j12``) or a job name; names are resolved to ids when the job is accepted."""
Deps = Annotated[list[JobRef], Field(max_length=MAX_DEPENDENCIES)]


def _array_text(value: str) -> str:
    try:
        parse_array(value)
    except ArraySpecError as exc:
        raise ValueError(str(exc)) from None
    return value


class ArrayTask(BaseModel):
    """Which task of which array a job is: set by gpufence on every task, never by a client."""

    job: str = Field(
        description="id of the array (its own; an array an older version stored: its first task's)"
    )
    index: int = Field(ge=0, description="GPUFENCE_ARRAY_TASK_ID of this task")
    cap: int = Field(default=0, ge=0, description="tasks of the array queued or running at once")

    model_config = ConfigDict(extra="forbid")


Arg = Annotated[str, _pattern(ARG_PATTERN), AfterValidator(_arg_text)]


def escape(text: object) -> str:
    """``text`` fit for one log line: control characters and lone surrogates as escapes, so a
    newline in user input cannot forge a line of the server log."""
    s = str(text)
    if s.isprintable() and s.isascii():
        return s
    s = s.encode("utf-8", "backslashreplace").decode("utf-8")
    s = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", s)
    return _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", s)


def _number_not_bool(value: object) -> object:
    # JSON true/false is no number: lax validation would read "gpus": true as 1 GPU; nor is a
    # string ("5_0" read as 50, "1e3" as 1000: what a typo in a script would pass unnoticed)
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not {str(value).lower()}")
    if isinstance(value, str | bytes):
        raise ValueError(f"must be a number, not the string {value!r}")
    return value


def _flag_is_bool(value: object) -> object:
    # only true/false: lax validation would read 1, "yes" or "off" as a flag
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


# the JSON types of the submit body, checked before pydantic's lax conversion: on the type, so
# a field added later gets the check by being declared with it
Int = Annotated[int, BeforeValidator(_number_not_bool)]
Float = Annotated[float, BeforeValidator(_number_not_bool)]
Flag = Annotated[bool, BeforeValidator(_flag_is_bool)]


Label = Annotated[
    str, Field(max_length=MAX_NAME), _pattern(LABEL_PATTERN), AfterValidator(_label_text)
]
"""A partition or queue: a name, or "" for the default."""


class SubmitRequest(BaseModel):
    command: list[Arg] = Field(
        min_length=1,
        max_length=MAX_ARGS,
        description="argv of each replica (no shell); command[0], the program, is not empty",
        # command[0] (the program) is no empty string: JSON Schema says it with prefixItems
        json_schema_extra={
            "prefixItems": [{"type": "string", "minLength": 1, "pattern": ARG_PATTERN}]
        },
    )
    name: Annotated[Name, _pattern(JOB_NAME_PATTERN)] | None = None
    workload_class: WorkloadClass = Field(default=WorkloadClass.TRAINING, alias="class")
    gpus: Int = Field(default=1, ge=0, le=1024, description="whole GPUs per replica")
    mig: Name | None = Field(default=None, description="one MIG instance of this profile")
    gpu_fraction: Float | None = Field(default=None, gt=0.0, lt=1.0)
    gpu_mem_gib: Float | None = Field(
        default=None, gt=0.0, le=MAX_GPU_MEM_GIB, description="GiB, with gpu_fraction"
    )
    replicas: Int = Field(default=1, ge=1, le=4096)
    partition: Label = ""
    queue: Label = ""
    priority: Int = Field(default=0, ge=-1000, le=1000)
    checkpointable: Flag = False
    est_runtime_s: Float | None = Field(
        default=None, gt=0.0, le=MAX_RUNTIME_S, description="seconds, at most ten years"
    )
    env: dict[str, Arg] = Field(
        default_factory=dict,
        max_length=MAX_ENV,
        json_schema_extra={"propertyNames": {"pattern": ENV_NAME_PATTERN}},
    )
    cwd: (
        Annotated[
            str,
            Field(min_length=1, max_length=MAX_PATH),
            _pattern(ABS_PATH_PATTERN),
            AfterValidator(_abs_path),
        ]
        | None
    ) = Field(default=None, description="absolute working directory of every replica")
    container: (
        Annotated[
            str,
            Field(min_length=1, max_length=MAX_PATH),
            _pattern(ABS_PATH_PATTERN),
            AfterValidator(_abs_path),
        ]
        | None
    ) = Field(
        default=None,
        description="absolute path, on the server, of a container image to run every replica "
        "in: an Apptainer/Singularity .sif file or a directory holding an unpacked root file "
        "system",
    )
    cpus: Float | None = Field(
        default=None,
        ge=0.001,
        le=MAX_CPUS,
        description="CPU cores per replica (fractions allowed): placed on a node that has them "
        "free, and the member is limited to them",
    )
    mem_bytes: Int | None = Field(
        default=None,
        ge=MIB,
        le=MAX_MEM_BYTES,
        description="host memory per replica in bytes: placed on a node that has it free; a "
        "member over it is OOM-killed (job failed, reason 'oom')",
    )
    log_limit_bytes: Int | None = Field(
        default=None,
        ge=MIN_LOG_LIMIT,
        le=MAX_LOG_LIMIT,
        description="cap on each replica's stdout and stderr in bytes: past it the log keeps its "
        "first half, a note and the newest output (event 'log-limit'); at most its "
        "partition's log_limit_mib (the default)",
    )
    time_limit_s: Float | None = Field(
        default=None,
        gt=0.0,
        le=MAX_TIME_LIMIT_S,
        description="wall-clock limit of one attempt in seconds: stopped at it (notice first "
        "if checkpointable), reason 'time-limit'",
    )
    slo_p99_ms: Float | None = Field(
        default=None,
        gt=0.0,
        le=3_600_000.0,
        allow_inf_nan=False,
        description="the p99 latency SLO of a serving job: its deployment's p99 and SLO attainment "
        "are judged against it (default: its partition's serving SLO)",
    )
    metrics_url: Annotated[str, _pattern(METRICS_URL_PATTERN)] | None = Field(
        default=None,
        max_length=2048,
        description="serving: the replica's Prometheus endpoint (http://HOST:PORT/metrics) that "
        "gpufence scrapes for a latency histogram; HOST must be loopback or in "
        "control.telemetry.scrape_hosts",
    )
    metrics_port: Int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="serving: as metrics_url, http://<the replica's node>:PORT/metrics",
    )
    latency_metric: Annotated[str, _pattern(METRIC_NAME_PATTERN)] | None = Field(
        default=None,
        max_length=200,
        description="serving: the histogram to read (default: any *_request_duration_seconds)",
    )
    max_attempts: Int = Field(
        default=3, ge=1, le=100, description="attempts when a run is lost (node failure, crash)"
    )
    tenant: Name | None = Field(default=None, description="admin only: submit on behalf of")
    after_ok: Deps = Field(
        default_factory=list,
        description="start only after each of these jobs (ids or names) ended done; if one "
        "ends otherwise this job is cancelled (reason 'dependency')",
    )
    after_any: Deps = Field(
        default_factory=list, description="start only after each of these jobs ended, however"
    )
    after_not_ok: Deps = Field(
        default_factory=list,
        description="start only after each of these jobs ended without success (failed, "
        "cancelled, ...); cancelled if one ends done",
    )
    hold: Flag = Field(default=False, description="submit on hold: pending until released")
    array: (
        Annotated[str, Field(max_length=256), _pattern(ARRAY_PATTERN), AfterValidator(_array_text)]
        | None
    ) = Field(
        default=None,
        description="a job array: one job per index ('0-99', '1,3,5-7', '0-20:2'), '%N' caps "
        "how many run at once ('0-99%8'); each task gets GPUFENCE_ARRAY_TASK_ID and "
        "GPUFENCE_ARRAY_JOB_ID",
    )
    array_task: ArrayTask | None = Field(
        default=None, description="read-only: set by gpufence on each task of an array"
    )
    pty: Flag = Field(
        default=False,
        description="run the command on a terminal that clients attach to (WebSocket "
        "/v1/jobs/{id}/pty; `gpufence run --pty`, `gpufence attach`): one replica, local executor",
    )
    pty_grace_s: Float | None = Field(
        default=None,
        gt=0.0,
        le=MAX_PTY_GRACE_S,
        description="a pty job: seconds it lives on with no terminal attached before its "
        f"session is hung up (default {DEFAULT_PTY_GRACE_S:g})",
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    @field_validator("command")
    @classmethod
    def _argv0(cls, command: list[str]) -> list[str]:
        if command and not command[0]:
            raise ValueError("command[0] (the program) must not be empty")
        return command

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for k in env:
            _utf8(k)
            if len(k) > 256 or not _ENV_NAME.fullmatch(k):
                raise ValueError(
                    f"'{escape(k)}' is not a valid environment variable name "
                    "(letters, digits and _, not starting with a digit)"
                )
            if k in RESERVED_ENV or k.startswith("GPUFENCE_"):
                raise ValueError(f"'{k}' is set by gpufence for every job; remove it")
        return env

    @field_validator("metrics_url")
    @classmethod
    def _metrics_url(cls, url: str | None) -> str | None:
        if url is None:
            return url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http(s) URL; e.g. http://127.0.0.1:8000/metrics")
        if parts.username or parts.password:
            raise ValueError("metrics_url must not carry credentials")
        return url

    @field_validator("latency_metric")
    @classmethod
    def _latency_metric(cls, name: str | None) -> str | None:
        if name is not None and not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a Prometheus metric name")
        return name

    @model_validator(mode="after")
    def _latency_source(self) -> SubmitRequest:
        declared = [
            f
            for f in ("metrics_url", "metrics_port", "latency_metric")
            if getattr(self, f) is not None
        ]
        if declared and self.workload_class is not WorkloadClass.SERVING:
            raise ValueError(
                f"{declared[0]} says where a serving job's latency comes from; "
                "submit it with class serving, or drop it"
            )
        if self.metrics_url is not None and self.metrics_port is not None:
            raise ValueError("give either metrics_url or metrics_port, not both")
        return self

    @model_validator(mode="after")
    def _one_terminal(self) -> SubmitRequest:
        if self.pty and self.replicas != 1:
            raise ValueError("a pty job has one terminal: submit it with replicas 1")
        if self.pty_grace_s is not None and not self.pty:
            raise ValueError("pty_grace_s is for a pty job: add pty, or drop it")
        return self

    @model_validator(mode="after")
    def _one_request_kind(self) -> SubmitRequest:
        if self.mig is not None and self.gpu_fraction is not None:
            raise ValueError("give either mig or gpu_fraction, not both")
        if (self.mig is not None or self.gpu_fraction is not None) and self.gpus not in (0, 1):
            raise ValueError("mig and gpu_fraction take one GPU share per replica; drop gpus")
        if self.gpu_mem_gib is not None and self.gpu_fraction is None:
            raise ValueError("gpu_mem_gib goes with gpu_fraction (a share of one GPU)")
        if self.gpu_fraction is not None and round(self.gpu_fraction * 1000) < 1:
            raise ValueError("gpu_fraction must be at least 0.001")
        if (
            self.time_limit_s is not None
            and self.est_runtime_s is not None
            and self.est_runtime_s > self.time_limit_s
        ):
            raise ValueError(
                f"est_runtime_s ({self.est_runtime_s:g}) is longer than time_limit_s "
                f"({self.time_limit_s:g}): the job would be stopped before its expected end; "
                "raise time_limit_s or lower est_runtime_s"
            )
        return self

    @property
    def cpu_only(self) -> bool:
        """Whether its replicas hold no GPU at all (``gpus: 0``: a prep or report step)."""
        return self.gpus == 0 and self.mig is None and self.gpu_fraction is None

    def with_cpu_default(self) -> SubmitRequest:
        """A CPU-only job that names no ``cpus`` takes one core per replica, as Slurm gives a
        task one CPU: the scheduler places it by that core (and counts it on the node), and its
        cgroup holds it to it. Applied at submit, so the stored spec says what it holds."""
        if self.cpu_only and self.cpus is None:
            return self.model_copy(update={"cpus": 1.0})
        return self

    @property
    def cpu_milli(self) -> int:
        """Per replica, as the core counts CPU (0: not requested)."""
        return round(self.cpus * 1000) if self.cpus is not None else 0

    @property
    def mem_mib(self) -> int:
        """Per replica, as the core counts host memory (0: not requested; rounded up)."""
        return -(-self.mem_bytes // MIB) if self.mem_bytes is not None else 0

    def request(self) -> GpuRequest:
        if self.mig is not None:
            return GpuRequest.mig(self.mig)
        if self.gpu_fraction is not None:
            mem = round((self.gpu_mem_gib or 0.0) * 1024)
            return GpuRequest.fraction(round(self.gpu_fraction * 1000), mem)
        return GpuRequest.whole(self.gpus)

    def to_job(
        self,
        job_id: str,
        submitted_at: float,
        tenant: str,
        held: bool | None = None,
        held_by: str = "",
    ) -> Job:
        """The core's job; ``tenant``: who submitted it, as the core knows tenants
        (``config.core_tenant``: the admin's jobs carry none; a job naming no queue goes to its
        tenant's queue, sched/intake.py); ``held``: whether it is on hold now (default: as
        submitted), ``held_by``: who held it (its pending reason names them)."""
        held = self.hold if held is None else held
        return Job(
            id=job_id,
            workload_class=self.workload_class,
            request=self.request(),
            replicas=self.replicas,
            queue=self.queue,
            partition=self.partition,
            priority=self.priority,
            checkpointable=self.checkpointable,
            est_runtime_s=self.est_runtime_s,
            submit_time=submitted_at,
            cpu_milli=self.cpu_milli,
            mem_mib=self.mem_mib,
            time_limit_s=self.time_limit_s,
            after=self.dependencies(),
            held=held,
            held_by=held_by if held else "",
            array_group=self.array_task.job if self.array_task is not None else "",
            array_cap=self.array_task.cap if self.array_task is not None else 0,
            tenant=tenant,
        )

    def dependencies(self) -> tuple[tuple[AfterKind, str], ...]:
        """``after_*`` as the core takes them (ids: names are resolved at submit)."""
        return (
            *((AfterKind.OK, j) for j in self.after_ok),
            *((AfterKind.ANY, j) for j in self.after_any),
            *((AfterKind.NOT_OK, j) for j in self.after_not_ok),
        )

    def array_env(self) -> dict[str, str]:
        """The variables that tell an array task which one it is (none for other jobs)."""
        t = self.array_task
        if t is None:
            return {}
        return {"GPUFENCE_ARRAY_TASK_ID": str(t.index), "GPUFENCE_ARRAY_JOB_ID": t.job}

    def stored(self) -> dict[str, Any]:
        """The JSON kept in the store (and shown back to the user)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class StoredSpecError(ValueError):
    """A spec in the store that this version no longer accepts (written by an older one)."""


def from_stored(spec: dict[str, Any]) -> SubmitRequest:
    try:
        return SubmitRequest.model_validate(spec)
    except ValidationError as exc:
        raise StoredSpecError(describe_errors(exc)) from None


def describe_errors(exc: ValidationError) -> str:
    """``field: message; ...`` of a validation error, escaped for logs and messages."""
    parts = []
    for e in exc.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in e["loc"])
        msg = escape(e["msg"].removeprefix("Value error, "))
        parts.append(f"{escape(loc)}: {msg}" if loc else msg)
    return "; ".join(parts)
