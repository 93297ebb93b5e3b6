"""A child server process on loopback: start with a readiness deadline, stop, kill, and an
exit hook that never leaves one behind. :mod:`conduit.services` says which servers."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import time
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from core.ports import LOOPBACK as HOST
from core.ports import free_port


class ServerStartError(RuntimeError):
    """A server exited during startup or was not ready before its deadline."""


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT leftovers
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


def _children(pid: int) -> list[int]:
    if not os.path.isdir("/proc"):  # macOS
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]
    kids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with suppress(OSError):  # field 4 of /proc/PID/stat is the ppid; comm may hold spaces
            if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
    return kids


CHILD_STDIO: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stderr": subprocess.STDOUT}
_LIVE: set[Server] = set()


@atexit.register
def _stop_all() -> None:  # safety net: never leave servers behind on interpreter exit
    for server in list(_LIVE):
        server.stop(timeout=5)


class Server:
    """A child server process on 127.0.0.1:port whose files live in ``workdir``."""

    name = "server"
    stop_signal = signal.SIGTERM
    start_timeout = 10.0

    def __init__(self, workdir: str | os.PathLike[str], port: int | None = None) -> None:
        self.workdir = Path(workdir).absolute()
        self.port = port if port is not None else free_port()
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / f"{self.name}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_bytes()[-8192:].decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _prepare(self) -> dict[str, Any]:
        """Create directories; return extra Popen kwargs."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return {}

    def _ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float | None = None) -> Self:
        """Start the server and block until it accepts connections (or raise)."""
        if self.running:
            raise RuntimeError(f"{self.name} already running (pid {self.pid})")
        kwargs = self._prepare()
        if not port_is_free(self.port):
            raise ServerStartError(f"{self.name}: port {HOST}:{self.port} is already in use")
        # Own session: a terminal's Ctrl-C only reaches us, and we stop the servers in order.
        with open(self.log_path, "ab") as log:
            self._proc = proc = subprocess.Popen(
                self._argv(),
                stdout=log,
                **CHILD_STDIO,
                cwd=self.workdir,
                start_new_session=True,
                **kwargs,
            )
        _LIVE.add(self)
        limit = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while not self._ready():
            if proc.poll() is not None:
                _LIVE.discard(self)
                raise ServerStartError(
                    f"{self.name} exited with code {proc.returncode} during startup; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise ServerStartError(
                    f"{self.name} not ready on port {self.port} after {limit:.0f}s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.02)
        return self

    def _signal_all(self, sig: signal.Signals) -> None:
        """Signal the server's process group and its direct children (postgres children call
        setsid(), so the group alone misses them). Only while the leader is unreaped (its pid
        cannot be reused), and with the leader frozen so it neither forks nor reaps meanwhile."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        with suppress(ProcessLookupError):
            if sig != signal.SIGCONT:
                os.kill(proc.pid, signal.SIGSTOP)
            for pid in _children(proc.pid):
                with suppress(ProcessLookupError):
                    os.kill(pid, sig)
            os.killpg(proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful shutdown signal, wait up to ``timeout``, then SIGKILL everything."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(self.stop_signal)
            self._signal_all(signal.SIGCONT)  # a paused server must wake up to exit
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_all(signal.SIGKILL)
                proc.wait()
        _LIVE.discard(self)

    def kill(self) -> None:
        """SIGKILL the server and all its processes (one that never became ready; a crash)."""
        self._signal_all(signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait()
        _LIVE.discard(self)

    def __enter__(self) -> Self:
        return self if self.running else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
