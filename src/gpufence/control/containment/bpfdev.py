"""A cgroup v2 device program: eBPF that refuses a member's cgroup the denied device nodes.

cgroup v2 has no ``devices.deny`` file; the kernel asks a ``BPF_PROG_TYPE_CGROUP_DEVICE``
program attached to the cgroup instead. This module assembles that program (a handful of
instructions: compare the device's type, major and minor with each denied rule, or with each run
of consecutive minors, such as the ~135 MIG capability devices of one GPU, so the program stays
far below the kernel's 4,096-instruction limit; a match returns 0 = refuse, anything else
1 = allow), loads it with the ``bpf(2)`` system call through ctypes and
attaches it to the member's cgroup with ``BPF_F_ALLOW_MULTI`` (programs on parent cgroups, e.g.
systemd's, still apply). The attachment lives as long as the cgroup; the program fd is closed
after attaching.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from collections.abc import Sequence
from pathlib import Path

from gpufence.control.containment.devicerules import DeviceRule

_NR_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}
_BPF_PROG_LOAD = 5
_BPF_PROG_ATTACH = 8
_BPF_PROG_TYPE_CGROUP_DEVICE = 15
_BPF_CGROUP_DEVICE = 6
_BPF_F_ALLOW_MULTI = 2
_ATTR_SIZE = 128  # >= every field we pass; the kernel wants the rest zeroed

# instruction opcodes (linux/bpf_common.h + linux/bpf.h)
_LDX_MEM_W = 0x61  # dst = *(u32 *)(src + off)
_AND64_K = 0x57  # dst &= imm
_JNE_K = 0x55  # if dst != imm: pc += off
_JGT_K = 0x25  # if dst > imm (unsigned): pc += off
_JLT_K = 0xA5  # if dst < imm (unsigned): pc += off
_MOV64_K = 0xB7  # dst = imm
_EXIT = 0x95
_DEV_CHAR, _DEV_BLOCK = 2, 1  # BPF_DEVCG_DEV_*: the low 16 bits of access_type


class BpfError(OSError):
    """The kernel refused to load or attach the program (errno and the verifier's log)."""


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def runs(deny: Sequence[DeviceRule]) -> list[tuple[str, int, int, int]]:
    """The rules as (kind, major, first minor, last minor): rules next to each other with
    consecutive minors of one major make one run (``devicerules.denied`` gives them sorted)."""
    out: list[tuple[str, int, int, int]] = []
    for r in deny:
        if out and out[-1][:2] == (r.kind, r.major) and out[-1][3] + 1 == r.minor:
            out[-1] = (r.kind, r.major, out[-1][2], r.minor)
        else:
            out.append((r.kind, r.major, r.minor, r.minor))
    return out


def program(deny: Sequence[DeviceRule]) -> bytes:
    """The eBPF instructions: r1 = struct bpf_cgroup_dev_ctx {access_type, major, minor}."""
    out = [
        _insn(_LDX_MEM_W, 2, 1, 0),  # r2 = access_type
        _insn(_AND64_K, 2, imm=0xFFFF),  # r2 = device type
        _insn(_LDX_MEM_W, 3, 1, 4),  # r3 = major
        _insn(_LDX_MEM_W, 4, 1, 8),  # r4 = minor
    ]
    for kind_name, major, first, last in runs(deny):
        kind = _DEV_CHAR if kind_name == "c" else _DEV_BLOCK
        # each test skips to the next rule on a mismatch
        if first == last:
            minor = [_insn(_JNE_K, 4, off=2, imm=first)]
        else:
            minor = [_insn(_JLT_K, 4, off=3, imm=first), _insn(_JGT_K, 4, off=2, imm=last)]
        skip = len(minor) + 2
        out += [
            _insn(_JNE_K, 2, off=skip + 1, imm=kind),
            _insn(_JNE_K, 3, off=skip, imm=major),
            *minor,
            _insn(_MOV64_K, 0, imm=0),
            _insn(_EXIT),
        ]
    out += [_insn(_MOV64_K, 0, imm=1), _insn(_EXIT)]
    return b"".join(out)


def _bpf(cmd: int, attr: bytes) -> int:
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise BpfError(0, f"bpf(2): unknown system call number on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(attr.ljust(_ATTR_SIZE, b"\0"), _ATTR_SIZE)
    res = int(libc.syscall(nr, cmd, buf, _ATTR_SIZE))
    if res < 0:
        err = ctypes.get_errno()
        raise BpfError(err, f"bpf(2) command {cmd}: {os.strerror(err)}")
    return res


def _load(code: bytes, log: ctypes.Array[ctypes.c_char] | None) -> int:
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = struct.pack(
        "<IIQQIIQII16sII",
        _BPF_PROG_TYPE_CGROUP_DEVICE,
        len(code) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(license_),
        0 if log is None else 1,  # log_level
        0 if log is None else len(log),
        0 if log is None else ctypes.addressof(log),
        0,  # kern_version
        0,  # prog_flags
        b"gpufence_dev",
        0,  # prog_ifindex
        0,  # expected_attach_type
    )
    return _bpf(_BPF_PROG_LOAD, attr)


def load(deny: Sequence[DeviceRule]) -> int:
    """Load the program; its fd (the caller closes it). Loaded without the verifier's log:
    with one, a program that the verifier accepts is refused (ENOSPC) once its log outgrows the
    buffer, which ~20 scattered rules did; the log is asked for only to say why a load
    failed."""
    code = program(deny)
    try:
        return _load(code, None)
    except BpfError as first:
        log = ctypes.create_string_buffer(1 << 16)
        try:
            return _load(code, log)  # refused again, but now saying why
        except BpfError:
            why = log.value.decode(errors="replace").strip().splitlines()
            tail = f": {why[-1]}" if why else ""
            raise BpfError(first.errno, f"{first.strerror}{tail}") from None


def attach(cgroup_dir: Path, deny: Sequence[DeviceRule]) -> None:
    """Load the program for ``deny`` and attach it to ``cgroup_dir``."""
    prog = load(deny)
    try:
        cg = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            attr = struct.pack("<IIIII", cg, prog, _BPF_CGROUP_DEVICE, _BPF_F_ALLOW_MULTI, 0)
            _bpf(_BPF_PROG_ATTACH, attr)
        finally:
            os.close(cg)
    finally:
        os.close(prog)


def probe() -> str | None:
    """None if this kernel loads device programs for us; else why not (for the log)."""
    try:
        os.close(load(()))
    except BpfError as exc:
        return f"BPF device programs unavailable ({exc.strerror})"
    return None
