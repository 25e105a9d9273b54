"""Embedded Milvus standalone server (PyPI wheel ``milvus==2.3.5``) as a subprocess.

Our top-level package is also called ``milvus``, so the server wheel must never be
installed into the project's environment. It lives in an isolated directory
(default ``<repo>/.cache/milvus-server``, or ``$DMEM_MILVUS_SERVER_DIR``)::

    pip install --no-deps --target .cache/milvus-server milvus==2.3.5

and is started here in a child Python process (``python -I -c ...``, cwd = the data
dir) whose ``sys.path`` has that directory first, so ``from milvus import
default_server`` resolves to the server wheel and not to this package.

Decisions:
- Ports: every ``*_port`` of the server config and the health/metrics port start
  from an OS-chosen free port (the wheel then scans upward from there), so several
  servers can run on one machine. The wheel always starts its embedded etcd with the
  default peer port 2380; we point ``etcd.config.path`` at a generated etcd config
  with free client and peer ports.
- Binaries: the wheel decompresses ~200 MB of lzma'd binaries into every base dir.
  We decompress them once into a shared cache (``<install_dir>/../milvus-server-bin``,
  under a file lock) and symlink ``<base_dir>/bin`` to it; if the cache is not
  writable we fall back to the wheel's per-dir behaviour.
- Lifetime: the child and the milvus binary run in their own process group. The
  child stops the server when its stdin closes (the parent exited or called
  ``stop()``) or on SIGTERM; ``stop()`` then kills the whole group as a last resort,
  so no orphaned milvus/etcd is left behind.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from schemas.errors import ConfigError, StoreUnavailable

__all__ = ["EmbeddedMilvusServer", "default_install_dir", "milvus_lite_uri"]

INSTALL_HINT = "pip install --no-deps --target {dir} milvus==2.3.5"
_REPO_ROOT = Path(__file__).resolve().parent.parent


def default_install_dir() -> str:
    """``$DMEM_MILVUS_SERVER_DIR`` or ``<repo>/.cache/milvus-server``."""
    env = os.environ.get("DMEM_MILVUS_SERVER_DIR")
    return env if env else str(_REPO_ROOT / ".cache" / "milvus-server")


def milvus_lite_uri(data_dir: str | os.PathLike[str], name: str = "dmem") -> str:
    """The Milvus Lite URI (a ``.db`` file path; pymilvus requires the suffix) in ``data_dir``.

    Creates ``data_dir`` if missing.
    """
    path = Path(data_dir).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return str(path / f"{name}.db")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The child program. Runs with ``python -I`` (no cwd / script dir on sys.path) in
# the data dir; argv[1] is a JSON object of settings. Prints one JSON line on stdout
# when ready ({"port": ...}) or failed ({"error": ...}), then waits for stdin EOF.
_CHILD = r"""
import fcntl, json, os, re, signal, sys, threading, traceback
cfg = json.loads(sys.argv[1])
sys.path.insert(0, cfg["install_dir"])
def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
os.umask(0o077)  # data, logs and configs: owner only
relay, isolation_error = None, None
if cfg.get("relay_port") is not None:
    # loopback only: milvus binds every component on all interfaces (":port"), so it
    # runs in a network namespace of its own (a user namespace makes that unprivileged)
    # that has nothing but its own loopback; the one listener on the host's 127.0.0.1,
    # made before the unshare and so still in the host's namespace, relays to the proxy
    import ctypes, socket as _so, struct
    lsock = _so.socket(_so.AF_INET, _so.SOCK_STREAM)
    try:
        lsock.setsockopt(_so.SOL_SOCKET, _so.SO_REUSEADDR, 1)
        lsock.bind(("127.0.0.1", cfg["relay_port"]))
        lsock.listen(128)
    except OSError as exc:
        say({"error": "relay port %d: %s" % (cfg["relay_port"], exc)})
        sys.exit(1)
    unshared = False
    try:
        uid, gid = os.getuid(), os.getgid()
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x10000000 | 0x40000000) != 0:  # CLONE_NEWUSER | CLONE_NEWNET
            err = ctypes.get_errno()
            raise OSError(err, "unshare(user, net): " + os.strerror(err))
        unshared = True
        for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)),
                           ("gid_map", "%d %d 1" % (gid, gid))):
            with open("/proc/self/" + name, "w") as fh:
                fh.write(text)
        probe = _so.socket(_so.AF_INET, _so.SOCK_DGRAM)  # ifconfig lo up
        flags = struct.unpack("16sh", fcntl.ioctl(probe, 0x8913, struct.pack("16sh", b"lo", 0)))[1]
        fcntl.ioctl(probe, 0x8914, struct.pack("16sh", b"lo", flags | 0x1))
        probe.close()
        relay = lsock
    except OSError as exc:
        lsock.close()
        isolation_error = str(exc)
        if unshared or cfg.get("require_isolation"):  # half isolated: no way back
            say({"error": "cannot isolate milvus on loopback: %s" % exc})
            sys.exit(1)
try:
    import milvus as _wheel
    from milvus import default_server as srv
    if not hasattr(srv, "set_base_dir"):
        raise RuntimeError("'milvus' at %s is not the server wheel" % _wheel.__file__)
    base = cfg["base_dir"]
    srv.set_base_dir(base)
    conf = srv.config
    if cfg.get("reuse_addr"):
        # restart on the same ports: the wheel's probe bind (no SO_REUSEADDR) fails
        # for ~60 s while old connections sit in TIME_WAIT and then scans upward to
        # another port; milvus itself (Go) binds with SO_REUSEADDR, so probe alike
        # (even with SO_REUSEADDR the probe can fail on a pinned port
        # right after a stop, and one component scanning upward onto another's
        # port moves the proxy); every pinned port is therefore trusted as long as
        # nothing listens on it, and milvus reports a real conflict itself
        import socket as _socket
        pinned = set(cfg["ports"].values())
        def _try_bind(self, port):
            sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            try:
                sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", port))
                sock.listen()
                return sock
            except (OSError, ValueError, OverflowError):
                sock.close()
            if port not in pinned:
                return None
            probe = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            try:
                probe.settimeout(0.5)
                probe.connect(("127.0.0.1", port))
                return None  # something really listens there
            except OSError:
                return _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            finally:
                probe.close()
        type(conf).try_bind_port = _try_bind
    for key, port in cfg["ports"].items():
        conf.set(key, port)
    srv.webservice_port = cfg["web_port"]
    # a restart on the same data dir waits for the previous run's etcd sessions to
    # expire; the default 30s ttl (x2 retries) makes that ~1 min
    conf.set("common.session.ttl", cfg["session_ttl_s"])
    for key, value in cfg["extra_config"].items():
        conf.set(key, value)
    # embedded etcd: free client + peer ports instead of the fixed 2380
    etcd_conf = os.path.join(base, "configs", "embed-etcd.yaml")
    cport, pport = cfg["ports"]["etcd_port"], cfg["etcd_peer_port"]
    with open(etcd_conf, "w") as fh:
        fh.write(
            "listen-client-urls: http://127.0.0.1:%d\n"
            "advertise-client-urls: http://127.0.0.1:%d\n"
            "listen-peer-urls: http://127.0.0.1:%d\n"
            "initial-advertise-peer-urls: http://127.0.0.1:%d\n"
            "initial-cluster: default=http://127.0.0.1:%d\n" % (cport, cport, pport, pport, pport)
        )
    conf.template_text = re.sub(
        r"(\n  use:\n    embed: true)",
        "\n  config:\n    path: " + etcd_conf + r"\1",
        conf.template_text,
        count=1,
    )
    conf.template_text = conf.template_text.replace(
        "localhost:{{ etcd_port", "127.0.0.1:{{ etcd_port"
    )
    cache = cfg.get("bin_cache")
    bin_dir = os.path.join(base, "bin")
    if cache and not os.path.exists(bin_dir):
        try:
            os.makedirs(cache, exist_ok=True)
            with open(os.path.join(cache, ".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                _wheel._initialize_data_files(cache)
            os.symlink(os.path.join(cache, "bin"), bin_dir)
        except OSError:
            pass  # not writable: the wheel decompresses into base_dir itself
    # the wheel expects the server to have started, then returns quickly
    srv.wait_for_started = True
    srv.start()
    if relay is not None:
        import socket as _so
        def pump(src, dst):
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for sk in (src, dst):
                    try:
                        sk.shutdown(_so.SHUT_RDWR)
                    except OSError:
                        pass
        def serve(port):
            while True:
                try:
                    outer, _ = relay.accept()
                except OSError:
                    return
                try:
                    inner = _so.create_connection(("127.0.0.1", port))
                except OSError:
                    outer.close()
                    continue
                for sk in (outer, inner):
                    sk.setsockopt(_so.IPPROTO_TCP, _so.TCP_NODELAY, 1)
                threading.Thread(target=pump, args=(outer, inner), daemon=True).start()
                threading.Thread(target=pump, args=(inner, outer), daemon=True).start()
        threading.Thread(target=serve, args=(srv.listen_port,), daemon=True).start()
    # the wheel may have scanned upward from our port: report what it really uses
    say({"port": srv.listen_port, "web_port": srv.webservice_port,
         "pid": srv.server_proc.pid,
         "ports": {k: conf.get(k) for k in cfg["ports"]},
         "relay_port": relay.getsockname()[1] if relay is not None else None,
         "isolation_error": isolation_error})
except BaseException as exc:
    say({"error": "%s: %s" % (type(exc).__name__, exc), "trace": traceback.format_exc()})
    try:
        srv.stop()
    except Exception:
        pass
    sys.exit(1)

done = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: done.set())
def watch_stdin():
    try:
        sys.stdin.read()
    finally:
        done.set()
threading.Thread(target=watch_stdin, daemon=True).start()
while not done.wait(1.0):
    if srv.server_proc is not None and srv.server_proc.poll() is not None:
        break
proc = srv.server_proc
if proc is not None and proc.poll() is None:
    proc.terminate()
    try:
        proc.wait(timeout=cfg["grace_s"])
    except Exception:
        proc.kill()
        proc.wait()
srv.server_proc = None
"""


class EmbeddedMilvusServer:
    """A Milvus 2.3.5 standalone server in a subprocess, for tests and local runs.

    ``time_tick_ms`` lowers ``proxy.timeTickInterval`` (default 200 ms): a Strong
    read waits for the next time tick, so tests use ~20 ms. ``extra_config`` sets
    any existing ``milvus.yaml`` key by dotted path (``{"common.session.ttl": 10}``).
    ``start_s`` holds the last start's duration.

    >>> with EmbeddedMilvusServer("/tmp/milvus-data") as srv:   # doctest: +SKIP
    ...     store = MemoryStore(srv.uri)
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        install_dir: str | os.PathLike[str] | None = None,
        *,
        bin_cache_dir: str | os.PathLike[str] | None = None,
        stop_grace_s: float = 10.0,
        session_ttl_s: int = 10,
        time_tick_ms: int | None = None,
        extra_config: Mapping[str, Any] | None = None,
        loopback_only: bool = False,
        require_isolation: bool = False,
    ) -> None:
        self.base_dir = Path(base_dir).expanduser().resolve()
        self.install_dir = Path(install_dir or default_install_dir()).expanduser().resolve()
        if bin_cache_dir is None:
            bin_cache_dir = self.install_dir.parent / "milvus-server-bin"
        self.bin_cache_dir = Path(bin_cache_dir).expanduser().resolve()
        self.stop_grace_s = stop_grace_s
        self.session_ttl_s = session_ttl_s
        self.extra_config: dict[str, Any] = dict(extra_config or {})
        if time_tick_ms is not None:
            self.extra_config["proxy.timeTickInterval"] = int(time_tick_ms)
        self.loopback_only = loopback_only
        self.require_isolation = require_isolation
        #: after a start with ``loopback_only``: None when milvus is reachable on the
        #: host's 127.0.0.1 only, else why it could not be isolated (it then listens on
        #: every interface, as without ``loopback_only``)
        self.isolation_error: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.start_s: float | None = None
        self._ports: dict[str, Any] | None = None  # the last start's ports, for restart()

    # -- state -----------------------------------------------------------------
    @property
    def uri(self) -> str:
        if self.port is None:
            raise ConfigError("embedded Milvus server is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_dir(self) -> Path:
        return self.base_dir / "logs"

    def check_installed(self) -> None:
        """Raise ConfigError (with the install command) if the server wheel is missing."""
        pkg = self.install_dir / "milvus"
        if not (pkg / "__init__.py").is_file() or not (pkg / "data" / "bin").is_dir():
            raise ConfigError(
                f"Milvus server wheel not found in {self.install_dir}; install it with: "
                + INSTALL_HINT.format(dir=self.install_dir)
                + " (or set DMEM_MILVUS_SERVER_DIR)"
            )

    # -- lifecycle ---------------------------------------------------------------
    def restart(self, timeout_s: float = 120.0) -> str:
        """Stop, then start again on the same data dir *and the same ports*.

        Clients keep their URI across the restart (fault injection: a Milvus
        outage). The ports were free at the first start; after a stop they
        normally are again (the server does not linger).
        """
        ports = self._ports
        if ports is not None:
            ports = {**ports, "reuse_addr": True}
        self.stop()
        return self.start(timeout_s=timeout_s, _ports=ports)

    def start(self, timeout_s: float = 60.0, _ports: dict[str, Any] | None = None) -> str:
        """Start the server and wait until it is healthy; returns its URI."""
        if self.running:
            return self.uri
        self.check_installed()
        self.base_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        keys = [
            "etcd_port", "root_coord_port", "proxy_port", "proxy_internal_port",
            "query_coord_port", "query_node_port", "index_coord_port", "index_node_port",
            "data_coord_port", "data_node_port",
        ]  # fmt: skip
        ports = _ports or {
            "ports": {k: _free_port() for k in keys},
            "web_port": _free_port(),
            "etcd_peer_port": _free_port(),
            "relay_port": _free_port() if self.loopback_only else None,
        }
        self._ports = ports
        settings = {
            "install_dir": str(self.install_dir),
            "base_dir": str(self.base_dir),
            "bin_cache": str(self.bin_cache_dir),
            **ports,
            "grace_s": self.stop_grace_s,
            "session_ttl_s": self.session_ttl_s,
            "extra_config": self.extra_config,
            "require_isolation": self.require_isolation,
        }
        t0 = time.monotonic()
        log_fd = os.open(self.base_dir / "launcher.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                         0o600)  # fmt: skip
        with open(log_fd, "ab") as launcher_log:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _CHILD, json.dumps(settings)],
                cwd=str(self.base_dir),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=launcher_log,
                start_new_session=True,
            )
        try:
            line = self._read_line(timeout_s)
        except BaseException:
            self.stop()
            raise
        if line is None:
            self.stop()
            raise StoreUnavailable(
                f"embedded Milvus did not start within {timeout_s:.0f}s (logs: {self.log_dir})"
            )
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            msg = {"error": f"unexpected output {line!r}"}
        if "error" in msg:
            self.stop()
            raise StoreUnavailable(
                f"embedded Milvus failed to start: {msg['error']} (logs: {self.log_dir})"
            )
        self.port = int(msg["port"])
        self.isolation_error = msg.get("isolation_error") if self.loopback_only else None
        if msg.get("relay_port"):  # clients reach milvus through the host-side relay
            self.port = int(msg["relay_port"])
        if isinstance(msg.get("ports"), dict):  # what the wheel really used: restart() pins it
            self._ports = {
                **ports,
                "ports": {k: int(v) for k, v in msg["ports"].items()},
                "web_port": int(msg.get("web_port") or ports["web_port"]),
            }
        self.start_s = time.monotonic() - t0
        return self.uri

    def _read_line(self, timeout_s: float) -> str | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        buf = b""
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:  # child exited
                    break
                buf += chunk
            elif self._proc.poll() is not None:
                break
        if not buf:
            return None if self._proc.poll() is None else '{"error": "launcher exited"}'
        return buf.split(b"\n", 1)[0].decode("utf-8", "replace")

    def stop(self) -> None:
        """Stop the server (graceful, then SIGKILL to the whole process group)."""
        proc, self._proc = self._proc, None
        self.port = None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the child leads its group
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # child sees EOF -> terminates milvus gracefully
        except OSError:
            pass
        try:
            proc.wait(timeout=self.stop_grace_s + 5)
        except subprocess.TimeoutExpired:
            self._signal_group(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        # whatever is left in the group (milvus, if the launcher died first)
        self._signal_group(pgid, signal.SIGKILL)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

    @staticmethod
    def _signal_group(pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> EmbeddedMilvusServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __del__(self) -> None:  # best effort: never leave a server behind
        try:
            if self._proc is not None:
                self.stop()
        except Exception:
            pass
