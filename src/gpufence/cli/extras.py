"""Which verbs need which optional part of the package, and the error when it is missing.

``pip install gpufence`` is the client (submit, queue, logs, ...), ``validate`` and
``examples``: pydantic, PyYAML, typer, rich. The rest are extras (pyproject.toml):

* ``gpufence[server]``: ``up`` and ``demo`` (FastAPI, uvicorn, prometheus-client, nvidia-ml-py,
  and numpy for the scheduling core);
* ``gpufence[sim]``: ``sim``, ``size``, ``demo --simulated`` (numpy, matplotlib);
* ``gpufence[ray]``: ``up --executor ray``.

Each of those verbs calls ``require`` before it imports anything heavy, so a client-only install
says what to install instead of raising an ImportError; ``install_hint`` turns an ImportError that
slips through anyway into the same sentence (``main`` catches it).
"""

from __future__ import annotations

import importlib.util

import typer

from gpufence.cli.render import err_console

EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "server": ("fastapi", "uvicorn", "prometheus_client", "pynvml", "numpy"),
    "sim": ("numpy", "matplotlib"),
    "ray": ("ray",),
}
"""The import names each extra brings (``pynvml`` is the module of ``nvidia-ml-py``)."""

_EXTRA_OF = {
    "fastapi": "server",
    "starlette": "server",
    "uvicorn": "server",
    "prometheus_client": "server",
    "pynvml": "server",
    "numpy": "server",  # the scheduling core's; `sim` brings it too
    "matplotlib": "sim",
    "ray": "ray",
}


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` this environment cannot import."""
    return [m for m in EXTRA_MODULES[extra] if importlib.util.find_spec(m) is None]


def install_sentence(extra: str, what: str, missing: list[str]) -> str:
    return (
        f"{what} needs the {extra} extra, which is not installed (missing: "
        f"{', '.join(missing)}): pip install 'gpufence[{extra}]'"
    )


def require(extra: str, what: str) -> None:
    """Exit 1 with the install command when ``extra``'s modules are missing; ``what`` names the
    verb, e.g. ``"gpufence up"``."""
    missing = missing_modules(extra)
    if missing:
        err_console().print(
            f"error: {install_sentence(extra, what, missing)}", markup=False, soft_wrap=True
        )
        raise typer.Exit(1)


def install_hint(exc: ImportError) -> str | None:
    """The install sentence for an ImportError of a module an extra brings, else None."""
    top = (exc.name or "").split(".")[0]
    extra = _EXTRA_OF.get(top)
    if extra is None:
        return None
    return install_sentence(extra, "this command", [top])
