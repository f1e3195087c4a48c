"""``gpufence k8s mig-config``: the ``mig-parted`` configs gpufence's dynamic MIG fences name
in ``nvidia.com/mig.config`` (kube/mig_parted.py), printed as the ConfigMap the GPU operator's
MIG manager reads, or checked against a given file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from gpufence.kube.mig_parted import MigPartedError, catalogue, missing, read_configs
from gpufence.model.mig import mig_models


def _file_configs(path: Path) -> dict[str, list[Any]]:
    """A mig-parted file, or a ConfigMap holding one (its first data value that is one)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise MigPartedError(f"--check {path}: {exc}") from None
    if isinstance(data, dict) and data.get("kind") == "ConfigMap":
        for key, text in (data.get("data") or {}).items():
            inner = yaml.safe_load(text) if isinstance(text, str) else None
            if isinstance(inner, dict) and "mig-configs" in inner:
                return read_configs(inner, f"{path} data.{key}")
        raise MigPartedError(f"--check {path}: the ConfigMap holds no mig-parted file")
    return read_configs(data, str(path))


def mig_config(
    model: Annotated[
        list[str],
        typer.Option(
            "--model",
            metavar="MODEL",
            help=f"the GPU model of the MIG nodes, repeatable ({', '.join(mig_models())})",
        ),
    ],
    gpus_per_node: Annotated[
        list[int],
        typer.Option("--gpus-per-node", metavar="N", help="GPUs per MIG node, repeatable"),
    ],
    check: Annotated[
        Path | None,
        typer.Option(
            "--check", metavar="FILE", help="list what this mig-parted file (or ConfigMap) lacks"
        ),
    ] = None,
    name: Annotated[
        str, typer.Option(metavar="NAME", help="the ConfigMap's name")
    ] = "gpufence-mig-parted",
    namespace: Annotated[
        str, typer.Option(metavar="NS", help="the GPU operator's namespace")
    ] = "gpu-operator",
) -> None:
    """Print the MIG manager's ConfigMap with every mig-parted config gpufence may name on
    such nodes (install it and set the GPU operator's migManager.config.name to it), or check
    a given file for them (exit 1 naming each missing config)."""
    unknown = [m for m in model if m not in mig_models()]
    if unknown:
        typer.echo(
            f"error: --model {unknown[0]}: not a MIG model (one of {', '.join(mig_models())})",
            err=True,
        )
        raise typer.Exit(2)
    try:
        if check is not None:
            given = _file_configs(check)
            lacking = [line for m in model for line in missing(given, m, gpus_per_node)]
            for line in lacking:
                typer.echo(f"missing: {line}")
            typer.echo(f"{check}: {len(lacking)} config(s) missing" if lacking else "ok")
            raise typer.Exit(1 if lacking else 0)
        configs: dict[str, Any] = {}
        for m in model:
            configs.update(catalogue(m, gpus_per_node)["mig-configs"])
    except MigPartedError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    body = yaml.safe_dump({"version": "v1", "mig-configs": configs}, sort_keys=True)
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"config.yaml": body},
    }
    typer.echo(yaml.dump(configmap, Dumper=_Literal, sort_keys=False), nl=False)


class _Literal(yaml.SafeDumper):
    """The ConfigMap's file as a ``|`` block: readable, and what ``kubectl`` shows."""


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Literal.add_representer(str, _str)
