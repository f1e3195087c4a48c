"""The submit request's body from a verb's options (``submit``, ``sbatch``, ``run --pty``): the
units parsed (``--mem 8G``, ``--time-limit 1h``), ``--env KEY=VALUE`` pairs, and a bad value
refused naming its flag (exit 2) before anything reaches the server."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import typer

from gpufence.cli.units import parse_duration, parse_size


def _parsed(parse: Callable[[str], float], text: str | None, flag: str) -> float | None:
    try:
        return parse(text) if text is not None else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from None


def parsed_size(text: str | None, flag: str) -> int | None:
    """Bytes of ``8G``, ``512M``... (None: not given); BadParameter naming ``flag``."""
    out = _parsed(parse_size, text, flag)
    return None if out is None else int(out)


def parsed_duration(text: str | None, flag: str) -> float | None:
    """Seconds of ``90``, ``30m``, ``01:30:00``... (None: not given); BadParameter naming
    ``flag``."""
    return _parsed(parse_duration, text, flag)


def parse_env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{p!r} is not KEY=VALUE", param_hint="--env")
        env[key] = value
    return env


def _where(p: dict[str, Any]) -> dict[str, Any]:
    """The body's command, working directory and image. In a container the working directory
    (the current one unless ``--cwd``) is mounted at its path, as Apptainer mounts $PWD."""
    body: dict[str, Any] = {"command": p["command"], "cwd": p["cwd"] or os.getcwd()}
    if p.get("container") is not None:
        body["container"] = os.path.abspath(p["container"])
    return body


def build_body(params: dict[str, Any]) -> dict[str, Any]:
    """The submit body of the verb's options (``params``: the click parameters)."""
    p = params
    body = _where(p)
    env = p["env"]
    mem_bytes = parsed_size(p["mem"], "--mem")
    log_bytes = parsed_size(p["log_limit"], "--log-limit")
    time_limit_s = parsed_duration(p["time_limit"], "--time-limit")
    if p["gpus"] is not None and p["gpus"] < 0:  # exit 2 naming the flag, before the server
        raise typer.BadParameter(
            f"{p['gpus']} is not 0 or more (GPUs per replica)", param_hint="--gpus"
        )
    optional: dict[str, Any] = {
        "gpus": p["gpus"],
        "mig": p["mig"],
        "gpu_fraction": p["gpu_fraction"],
        "gpu_mem_gib": p["gpu_mem"],
        "replicas": p["replicas"],
        "partition": p["partition"],
        "queue": p["queue"],
        "priority": p["priority"],
        "est_runtime_s": p["est_runtime"],
        "cpus": p["cpus"],
        "mem_bytes": mem_bytes,
        "log_limit_bytes": log_bytes,
        "time_limit_s": time_limit_s,
        "slo_p99_ms": p["slo_p99_ms"],
        "metrics_url": p["metrics_url"],
        "metrics_port": p["metrics_port"],
        "latency_metric": p["latency_metric"],
        "class": p["workload_class"],
        "name": p["name"],
        "max_attempts": p["max_attempts"],
        "tenant": p["tenant"],
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if p["mig"] is not None or p["gpu_fraction"] is not None:
        body.setdefault("gpus", 1)
    if p["checkpointable"]:
        body["checkpointable"] = True
    if env:
        body["env"] = parse_env(env)
    if p["array"] is not None:
        body["array"] = p["array"]
    for key in ("after_ok", "after_any", "after_not_ok"):
        refs = [r.strip() for item in p[key] or [] for r in item.split(",") if r.strip()]
        if refs:
            body[key] = refs
    if p["hold"]:
        body["hold"] = True
    return body
