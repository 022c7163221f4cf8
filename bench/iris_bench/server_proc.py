"""Runs an iris-server child process: starts it on port 0, waits for its
`iris-server: listening on HOST:PORT` line on stderr, and stops it with SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from typing import List, Optional, TextIO

_LISTENING = re.compile(r"iris-server: listening on (\S+):(\d+)")


class ServerError(RuntimeError):
    pass


class IrisServer:
    """`with IrisServer(bin, ["--model=DIR", ...]) as s: s.target` -> "127.0.0.1:PORT".
    The server's stderr is kept (`log()`) and copied to `log_file` if one is given."""

    def __init__(self, server_bin: str, args: List[str], startup_timeout_s: float = 600.0,
                 stop_timeout_s: float = 60.0, log_file: Optional[TextIO] = None, env=None):
        self.cmd = [server_bin, "--port=0"] + list(args)
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.log_file = log_file
        self.env = env
        self.proc: Optional[subprocess.Popen] = None
        self.host = self.port = None
        self._lines: List[str] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._reader: Optional[threading.Thread] = None
        self.returncode: Optional[int] = None

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def log(self) -> str:
        with self._lock:
            return "".join(self._lines)

    def _read(self) -> None:
        for line in self.proc.stderr:
            with self._lock:
                self._lines.append(line)
            if self.log_file is not None:
                self.log_file.write(line)
                self.log_file.flush()
            m = _LISTENING.search(line)
            if m and not self._ready.is_set():
                self.host, self.port = m.group(1), int(m.group(2))
                self._ready.set()
        self._ready.set()  # EOF: the process is gone

    def start(self) -> "IrisServer":
        try:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True, errors="replace",
                                         env=self.env)
        except OSError as e:
            raise ServerError(f"cannot run {self.cmd[0]}: {e.strerror or e}") from None
        self._reader = threading.Thread(target=self._read, name="iris-server-stderr", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._ready.wait(0.1):
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"iris-server did not report a port within {self.startup_timeout_s:g} s; "
                                  f"log:\n{self.log()[-4000:]}")
        if self.port is None:
            self.stop()
            raise ServerError(f"iris-server exited (status {self.returncode}) before listening; "
                              f"log:\n{self.log()[-4000:]}")
        return self

    def stop(self) -> Optional[int]:
        """SIGTERM, wait up to stop_timeout_s (then SIGKILL); returns the exit status."""
        if self.proc is None:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.returncode = self.proc.returncode
        if self._reader is not None:
            self._reader.join(10)
        self.proc.stderr.close()
        self.proc = None
        return self.returncode

    def __enter__(self) -> "IrisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
