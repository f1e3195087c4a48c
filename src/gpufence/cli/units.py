"""Sizes and durations as people type them on the command line (``--mem 4G``, ``--time-limit 2h``).

Sizes: a number and a unit, powers of 1024 as Slurm and Docker read them: ``K``/``KB``/``KiB``,
``M``/``MB``/``MiB``, ``G``/``GB``/``GiB``, ``T``/``TB``/``TiB`` (any case), or ``B`` for bytes.
A bare number is refused (is ``4096`` bytes or MiB?); the message says how to write it.

Durations: seconds as a bare number (``90``), units ``s``, ``m``, ``h``, ``d`` alone or combined
(``1h30m``), or clock form ``MM:SS``, ``HH:MM:SS``, ``D-HH:MM:SS`` (Slurm's ``--time`` forms, but a
bare number is seconds here, as everywhere in gpufence's API).
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_SIZE_UNITS = {
    "b": 1,
    **{u: 1 << 10 for u in ("k", "kb", "kib")},
    **{u: 1 << 20 for u in ("m", "mb", "mib")},
    **{u: 1 << 30 for u in ("g", "gb", "gib")},
    **{u: 1 << 40 for u in ("t", "tb", "tib")},
}
_PARTS = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_CLOCK = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$")


def parse_size(text: str) -> int:
    """Bytes of ``text``; ``ValueError`` with the accepted forms otherwise."""
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a size; write e.g. 512M or 4G (powers of 1024)")
    number, unit = m.groups()
    if not unit:
        raise ValueError(f"{text!r} has no unit: write {number}M or {number}G (or {number}B)")
    factor = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"{text!r}: unknown unit {unit!r} (use B, K, M, G or T)")
    return int(float(number) * factor)


def parse_duration(text: str) -> float:
    """Seconds of ``text``; ``ValueError`` with the accepted forms otherwise."""
    t = text.strip().lower()
    forms = "write e.g. 90 (seconds), 30m, 1h30m, 2d or 01:30:00"
    if re.fullmatch(r"\d+(?:\.\d+)?", t):
        return float(t)
    m = _CLOCK.match(t)
    if m is not None:
        days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
        if (minutes >= 60 and m.group(2) is not None) or seconds >= 60:
            raise ValueError(f"{text!r}: minutes and seconds go up to 59; {forms}")
        return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
    parts = _PARTS.findall(t)
    if not parts or "".join(n + u for n, u in parts) != t:
        raise ValueError(f"{text!r} is not a duration; {forms}")
    units = [u for _, u in parts]
    if len(set(units)) != len(units):
        raise ValueError(f"{text!r} repeats a unit; {forms}")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def format_size(n: int) -> str:
    for unit, factor in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= factor:
            return f"{n / factor:g}{unit}"
    return f"{n}B"


def format_duration(s: float) -> str:
    s = float(s)
    if s < 60:
        return f"{s:g}s"
    out = ""
    for unit, factor in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= factor:
            k = int(s // factor)
            out += f"{k}{unit}"
            s -= k * factor
    return out + (f"{s:g}s" if s else "")
