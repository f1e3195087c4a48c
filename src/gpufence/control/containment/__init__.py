"""Containment: the fence on the machine. Each gang member runs in its own cgroup.

What this package does, one module each:

* ``mounts``: where the cgroup hierarchies are mounted (v1 controllers, the v2 unified tree);
* ``detect``: which mode this machine supports (v2 with controllers, v1 controllers, none),
  decided once at start-up; ``gpufence up`` refuses to start without one unless
  ``--no-containment``;
* ``cgroup`` (the common interface and file helpers), ``cgroupv1`` and ``cgroupv2``: create a
  member's cgroup with its limits, signal and kill everything in it, tell when it is empty,
  read OOM kills and CPU time, remove it;
* ``devicerules`` and ``bpfdev``: device isolation (a member opens only its own GPUs' device
  nodes): v1 ``devices.deny`` entries, or a v2 BPF device program;
* ``members``: ``Containment``, what an executor holds: names and creates the cgroups of a
  launch's members, re-opens them on adoption (the job's directories are
  ``base/jobdirs.py``'s, the same with and without containment);
* ``spares`` and ``prestart``: members forked ahead of time into spare cgroups (v1);
* ``forkserver``: a pre-started process that forks launchers (``base/launcher.py``), so a
  member starts in ~1 ms instead of a fresh interpreter's ~25 ms.

Nothing is imported here: the fork server imports ``forkserver`` alone, with the standard
library only.
"""
