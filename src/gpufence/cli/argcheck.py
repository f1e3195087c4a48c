"""What a file given to ``sim`` / ``size`` looks like, so that arguments in the wrong place get
one sentence (``CLUSTER 'scenario-mixed-64.yaml' is a scenario ..., not a cluster spec``) instead
of the spec loader's dump of every field it did not expect.

``kind_of`` tells a cluster spec (a YAML mapping with ``node_groups`` / ``partitions``), a
scenario (``horizon_s``, ``services``, ...), a public trace (by the simulator's own detection),
another CSV or JSON file, or something else. Only a file that is positively something else is
refused here; a YAML mapping of neither kind goes on to the loader, whose field errors then say
what is wrong with it.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpufence.cli.connect import fail

CLUSTER_KEYS = ("node_groups", "partitions", "gpu_types", "fabric", "queues")
SCENARIO_KEYS = ("horizon_s", "services", "training", "notebooks", "batch", "node_failures")
_SNIFF = 1 << 16


@dataclass(frozen=True, slots=True)
class FileKind:
    kind: str
    """cluster, scenario, trace, csv, json, yaml (a mapping of neither kind), missing, other"""
    detail: str
    """what it looks like, for the sentence: 'a scenario (it has horizon_s, services)'"""


def _head(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_SNIFF)
    except OSError:
        return ""
    if raw[:2] == b"\x1f\x8b":
        return "\x00gzip"
    return raw.decode("utf-8", errors="replace")


def kind_of(path: Path) -> FileKind:
    if not path.exists():
        return FileKind("missing", "not found")
    if not path.is_file():
        return FileKind("other", "a directory, not a file")
    head = _head(path)
    trace = _trace_format(path)
    if trace is not None:
        return FileKind("trace", f"a {trace} trace")
    if head == "\x00gzip":
        return FileKind("other", "a gzip file of no trace format gpufence knows")
    stripped = head.lstrip()
    if stripped.startswith(("[", "{")) and path.suffix.lower() == ".json":
        return FileKind("json", "a JSON file")
    if path.suffix.lower() not in (".yaml", ".yml") and _looks_csv(head):
        first = next(csv.reader(io.StringIO(stripped)), [])
        cols = ", ".join(c.strip() for c in first[:4]) + (", …" if len(first) > 4 else "")
        return FileKind("csv", f"a CSV file (first row: {cols})")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
    except yaml.YAMLError:
        return FileKind("other", "neither YAML nor a trace")
    if not isinstance(doc, dict):
        return FileKind("other", f"YAML that is not a mapping ({type(doc).__name__})")
    keys = [str(k) for k in doc]
    cluster = [k for k in keys if k in CLUSTER_KEYS]
    scenario = [k for k in keys if k in SCENARIO_KEYS]
    if cluster and not scenario:
        return FileKind("cluster", f"a cluster spec (it has {', '.join(cluster[:3])})")
    if scenario and not cluster:
        return FileKind("scenario", f"a scenario (it has {', '.join(scenario[:3])})")
    return FileKind("yaml", f"a YAML mapping (keys: {', '.join(keys[:5])})")


def _looks_csv(head: str) -> bool:
    lines = [line for line in head.splitlines()[:3] if line.strip()]
    return bool(lines) and all("," in line for line in lines)


def _trace_format(path: Path) -> str | None:
    try:
        from gpufence.sim.workloads.trace_formats import TraceFormatError, detect
    except ImportError:  # the sim extra is missing: the verb says so before this
        return None
    try:
        return detect(path)
    except (TraceFormatError, OSError, ValueError, EOFError):
        return None


def check_cluster_arg(verb: str, cluster: Path, workload: Path | None) -> None:
    """Exit 2 with one sentence when CLUSTER is positively not a cluster spec."""
    kind = kind_of(cluster)
    if kind.kind in ("cluster", "yaml", "missing"):
        return  # the loader says what is wrong with a mapping of neither kind, or a missing file
    usage = f"gpufence {verb} CLUSTER.yaml" + (" WORKLOAD" if workload is not None else "")
    swapped = ""
    if workload is not None and kind_of(workload).kind == "cluster":
        swapped = f"; the arguments look swapped: gpufence {verb} {workload} {cluster}"
    raise fail(
        f"CLUSTER '{cluster}' is {kind.detail}, not a cluster spec (a YAML file with node_groups "
        f"and partitions): {usage}{swapped}"
    )


def check_workload_arg(verb: str, workload: Path, scenario_only: bool) -> None:
    """Exit 2 with one sentence when WORKLOAD is a cluster spec, or (``size``) not a scenario."""
    kind = kind_of(workload)
    if kind.kind == "cluster":
        want = "a scenario YAML" if scenario_only else "a scenario YAML or a trace file"
        raise fail(
            f"WORKLOAD '{workload}' is {kind.detail}, not {want}: gpufence {verb} CLUSTER.yaml "
            "SCENARIO.yaml (e.g. gpufence examples path scenario-mixed-64.yaml)"
        )
    if scenario_only and kind.kind in ("trace", "csv", "json", "other"):
        raise fail(
            f"WORKLOAD '{workload}' is {kind.detail}: gpufence {verb} sizes a serving fence from "
            "a scenario YAML with serving services (traces replay with gpufence sim)"
        )
