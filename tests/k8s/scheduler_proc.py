"""Run ``gpufence k8s run`` as a real subprocess against the test API server."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SchedulerProc:
    def __init__(
        self,
        kubeconfig: Path,
        config: Path,
        log: Path,
        *,
        leader_elect: bool = False,
        identity: str = "",
        extra: list[str] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        argv = [
            sys.executable,
            "-m",
            "gpufence",
            "k8s",
            "run",
            "--kubeconfig",
            str(kubeconfig),
            "--config",
            str(config),
            "--http",
            f"127.0.0.1:{self.port}",
            "--reason-delay",
            "0",
        ]
        argv += (
            [
                "--leader-elect",
                "--lease-seconds",
                "4",
                "--identity",
                identity or f"replica-{self.port}",
            ]
            if leader_elect
            else ["--no-leader-elect"]
        )
        argv += extra or []
        self._fh = log.open("ab")
        self.proc = subprocess.Popen(
            argv,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def readyz(self) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            return 0, str(e)

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            return str(r.read().decode())

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"gpufence k8s run exited {self.proc.returncode}:\n{self.log_tail()}"
                )
            if self.readyz()[0] == 200:
                return
            time.sleep(0.1)
        raise AssertionError(f"gpufence k8s run not ready after {timeout}s:\n{self.log_tail()}")

    def log_path_text(self) -> str:
        return self.log.read_text(errors="replace")

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._fh.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._fh.close()
