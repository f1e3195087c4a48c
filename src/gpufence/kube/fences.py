"""The cluster YAML on Kubernetes: the local plane's format, with nodes chosen by label.

On Kubernetes the nodes are not written in the file: they come and go through the API. So a
partition names a ``node_selector`` (labels every node it takes must carry) instead of
``nodes``/``gpus``, and ``node_groups`` is left out. Everything else -- admits, sharing, lending,
preemption, reclaim, queues, quotas -- is the same schema, checked by the same validator: the file
is checked by building it once over *virtual* nodes (one group per partition, as many GPUs as
its quotas and lending caps name), so every field error names its path and line exactly as
``gpufence validate`` does for the local plane. The real hardware is swapped in later
(kube/hardware.py) from the Nodes the API server reports.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpufence.kube.names import KubeNames
from gpufence.model.cluster import Cluster
from gpufence.spec import (
    SpecError,
    SpecIssue,
    cluster_from_dict,
    parse_yaml_text,
    read_spec_file,
)
from gpufence.spec.errors import Path, allowed_fields, locate, name_list, suggest
from gpufence.spec.schema import PartitionSchema

# a label key: an optional DNS-subdomain prefix and a name (Kubernetes' own rule, shortened)
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_VIRTUAL_TYPE = "H100-80GB"  # MIG-capable and in the catalogue: lets MIG layouts be checked
_KUBE_SECTION = "kubernetes"
_KUBE_KEYS = {"scheduler_name", "rack_label", "nvlink_label", "tolerated_taints"}
# a pod's spec.schedulerName is a DNS subdomain: a name outside the rule no pod can carry
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# 5,000 nodes (Kubernetes' tested limit) of 8 GPUs fit under it
MAX_FENCE_GPUS = 65536


@dataclass(frozen=True)
class FenceSpec:
    """A validated cluster file for Kubernetes: the partitions' node selectors (in file
    order) and the policy-only cluster (partitions, queues, declared GPU types) to which the
    observed hardware is added."""

    policy: Cluster
    selectors: Mapping[str, Mapping[str, str]]
    names: KubeNames
    source: str | None = None

    def partition_of(self, labels: Mapping[str, str]) -> tuple[str | None, list[str]]:
        """The partition whose selector a node's labels match, and every match (more than
        one is a conflict the caller reports; the node then belongs to none). A partition with
        an empty selector takes nodes that match no other."""
        matched = [
            p
            for p, sel in self.selectors.items()
            if sel and all(labels.get(k) == v for k, v in sel.items())
        ]
        if not matched:
            catch_all = [p for p, sel in self.selectors.items() if not sel]
            return (catch_all[0] if catch_all else None), catch_all
        return (matched[0] if len(matched) == 1 else None), matched


def _selector_issues(pname: str, raw: object) -> list[SpecIssue]:
    path: Path = ("partitions", pname, "node_selector")
    if not isinstance(raw, Mapping):
        msg = "must be a mapping of node label -> value, e.g. {gpufence.io/fence: training}"
        return [SpecIssue(path, msg)]
    out = []
    for key, value in raw.items():
        if not isinstance(key, str) or not _LABEL_KEY.match(key) or len(key) > 316:
            out.append(SpecIssue((*path,), f"{key!r} is not a Kubernetes label key"))
        elif not isinstance(value, str) or not _LABEL_VALUE.match(value) or len(value) > 63:
            msg = f"{value!r} is not a label value (quote it: a string of at most 63 "
            out.append(SpecIssue((*path, key), msg + "letters, digits, '-', '_' or '.')"))
    return out


def _take_partitions(data: dict[str, Any]) -> tuple[dict[str, dict[str, str]], list[SpecIssue]]:
    """Pull each partition's node_selector out (the local schema does not know it) and refuse
    the local plane's nodes/gpus selectors, naming the fix."""
    selectors: dict[str, dict[str, str]] = {}
    issues: list[SpecIssue] = []
    parts = data.get("partitions")
    if not isinstance(parts, dict):
        return selectors, issues  # the schema reports it
    for pname, p in parts.items():
        if not isinstance(p, dict):
            continue
        for local in ("nodes", "gpus"):
            if local in p:
                msg = "on Kubernetes a partition selects nodes by label: replace it with "
                msg += "node_selector: {LABEL: VALUE}"
                issues.append(SpecIssue(("partitions", pname, local), msg))
                p.pop(local)
        raw = p.pop("node_selector", None)
        if raw is None:
            msg = "required on Kubernetes: the node labels this partition takes, e.g. "
            msg += "node_selector: {gpufence.io/fence: " + str(pname) + "} ({} takes the rest)"
            issues.append(SpecIssue(("partitions", pname), msg))
            continue
        found = _selector_issues(str(pname), raw)
        issues.extend(found)
        if not found and isinstance(raw, Mapping):
            selectors[str(pname)] = {str(k): str(v) for k, v in raw.items()}
    empty = [p for p, sel in selectors.items() if not sel]
    for extra in empty[1:]:
        msg = f"only one partition may take the unlabelled rest ({empty[0]!r} already does)"
        issues.append(SpecIssue(("partitions", extra, "node_selector"), msg))
    return selectors, issues


def _virtual_gpus(pname: str, data: dict[str, Any], issues: list[SpecIssue]) -> int:
    """GPUs the virtual node of ``pname`` needs so that capacity rules (nominal quotas,
    lending caps) pass: the real capacity is checked against them at run time, when known.
    A figure past any cluster's size is a typo, said here (a virtual node of 10^8 GPUs took
    minutes and gigabytes to build); one that is not a finite number the schema names."""
    figures: list[tuple[Path, object]] = []
    queues = data.get("queues")
    for i, q in enumerate(queues if isinstance(queues, list) else ()):
        if isinstance(q, dict) and q.get("partition") == pname:
            figures.append((("queues", i, "nominal_gpus"), q.get("nominal_gpus")))
    part = data["partitions"][pname]
    rules = part.get("lending") if isinstance(part, dict) else None
    for i, rule in enumerate(rules if isinstance(rules, list) else ()):
        path: Path = ("partitions", pname, "lending", i, "cap_gpus")
        figures.append((path, rule.get("cap_gpus") if isinstance(rule, dict) else None))
    need, caps = 1.0, 0.0
    for path, value in figures:
        if not isinstance(value, int | float) or not math.isfinite(value):
            continue
        if value > MAX_FENCE_GPUS:
            msg = f"{value:.15g} GPUs is more than a Kubernetes cluster holds (at most "
            issues.append(SpecIssue(path, msg + f"{MAX_FENCE_GPUS}): a typo?"))
        elif path[-1] == "nominal_gpus":
            need += float(value)
        else:
            caps = max(caps, float(value))
    return max(1, min(MAX_FENCE_GPUS, math.ceil(max(need, caps))))


def _kube_words(issue: SpecIssue) -> SpecIssue:
    """The local schema's "unknown field" of a partition, with the fields a partition has on
    Kubernetes (node_selector, not nodes/gpus), so a misspelt node_selector is recognised."""
    path = issue.path
    if len(path) != 3 or path[0] != "partitions" or not issue.message.startswith("unknown field"):
        return issue
    local = set(allowed_fields(PartitionSchema)) - {"nodes", "gpus"}
    allowed = sorted(local | {"node_selector"})
    tail = suggest(str(path[2]), allowed)
    return replace(issue, message=f"unknown field (allowed: {name_list(allowed, limit=32)}){tail}")


def _kube_names(raw: object) -> tuple[KubeNames, list[SpecIssue]]:
    if raw is None:
        return KubeNames(), []
    if not isinstance(raw, Mapping):
        return KubeNames(), [SpecIssue((_KUBE_SECTION,), "must be a mapping")]
    issues = [
        SpecIssue((_KUBE_SECTION, k), f"unknown field (known: {', '.join(sorted(_KUBE_KEYS))})")
        for k in raw
        if k not in _KUBE_KEYS
    ]
    fields: dict[str, Any] = {}
    for key in _KUBE_KEYS & set(raw):
        value = raw[key]
        if key == "tolerated_taints":
            if not isinstance(value, list) or not all(_is_label_key(v) for v in value):
                msg = "must be a list of taint keys (label-key syntax: [prefix/]name)"
                issues.append(SpecIssue((_KUBE_SECTION, key), msg))
                continue
            fields[key] = tuple(value)
        elif not isinstance(value, str) or not value:
            issues.append(SpecIssue((_KUBE_SECTION, key), "must be a non-empty string"))
        elif key == "scheduler_name" and not _DNS_SUBDOMAIN.match(value):
            msg = f"{value!r} is no name a pod's schedulerName can carry (lowercase letters, "
            msg += "digits, '-' and '.', starting and ending alphanumeric, e.g. gpufence)"
            issues.append(SpecIssue((_KUBE_SECTION, key), msg))
        elif key != "scheduler_name" and not _is_label_key(value):
            msg = f"{value!r} is not a Kubernetes label key (e.g. gpufence.io/rack)"
            issues.append(SpecIssue((_KUBE_SECTION, key), msg))
        else:
            fields[key] = value
    return KubeNames(**fields), issues


def _is_label_key(key: object) -> bool:
    return isinstance(key, str) and len(key) <= 316 and bool(_LABEL_KEY.match(key))


def fence_spec_from_dict(
    data: object, *, source: str | None = None, lines: Mapping[Path, int] | None = None
) -> FenceSpec:
    if not isinstance(data, dict):
        raise SpecError(["a cluster spec must be a mapping with name and partitions"], source)
    data = dict(data)
    issues: list[SpecIssue] = []
    if "node_groups" in data:
        msg = "on Kubernetes the nodes come from the API server: remove node_groups and give "
        issues.append(SpecIssue(("node_groups",), msg + "each partition a node_selector"))
        data.pop("node_groups")
    names, kube_issues = _kube_names(data.pop(_KUBE_SECTION, None))
    issues.extend(kube_issues)
    parts = data.get("partitions")
    if isinstance(parts, dict):
        data["partitions"] = {k: dict(v) if isinstance(v, dict) else v for k, v in parts.items()}
    selectors, sel_issues = _take_partitions(data)
    issues.extend(sel_issues)
    groups: list[dict[str, object]] = []
    parts = data.get("partitions")
    for pname, p in parts.items() if isinstance(parts, dict) else ():  # (else: the schema's)
        group = f"virtual-{len(groups)}"
        gpus = _virtual_gpus(pname, data, issues)
        groups.append({"name": group, "count": 1, "gpus_per_node": gpus, "gpu_type": _VIRTUAL_TYPE})
        if isinstance(p, dict):
            p["nodes"] = [group]
    virtual = {"name": "virtual", "count": 1, "gpus_per_node": 1, "gpu_type": _VIRTUAL_TYPE}
    data["node_groups"] = groups or [virtual]
    try:
        policy = cluster_from_dict(data, source=source, lines=lines)
    except SpecError as exc:
        # (what the validator says of the virtual nodes is about nothing the user wrote)
        # (nor what it says of a capacity figure said here already)
        ours = {i.path for i in issues}
        theirs = [
            _kube_words(i)
            for i in exc.issues
            if i.path[:1] != ("node_groups",)
            and (i.anchor or ())[:1] != ("node_groups",)
            and i.path not in ours
        ]
        raise SpecError([*locate(issues, lines or {}), *theirs], source) from None
    if issues:
        raise SpecError(locate(issues, lines or {}), source)
    return FenceSpec(policy=policy, selectors=selectors, names=names, source=source)


def load_fence_spec(path: str | os.PathLike[str]) -> FenceSpec:
    source = os.fspath(path)
    data, lines, yaml_issues = parse_yaml_text(read_spec_file(path), source)
    if yaml_issues:
        raise SpecError(yaml_issues, source)
    return fence_spec_from_dict(data, source=source, lines=lines)
