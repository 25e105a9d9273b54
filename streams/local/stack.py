"""The embedded local stack: Tansu broker + Milvus (Lite or server) + worker processes.

Used by `dmem up` (developers of agents), `dmem demo` and the integration tests.
Workers run as subprocesses (`python -m streams.worker`) configured only by
environment variables, exactly like a production deployment; this keeps the
Milvus Lite file owned by one process at a time.

Milvus (``LocalStack(milvus=...)``):
- ``"lite"``: a Milvus Lite file under the data dir (``dmem demo``, most tests:
  nothing to start).
- ``"server"``: the embedded Milvus 2.3.5 standalone server (`milvus.server`,
  the wheel `scripts/setup.sh` installs into ``.cache/milvus-server``), data
  under ``<data_dir>/milvus-server``, HNSW-indexed.
- ``"auto"`` (``dmem up``): the server when its wheel is installed, else Lite
  with a warning. Why: Milvus Lite answers from an unindexed in-memory table
  until a segment is flushed, converting every row per query, so a Lite search
  grows linearly with the rows it holds, while the server answers in a few ms.
  A data dir that already holds a Lite file and no server data stays on Lite,
  so an upgrade never hides a user's memories.
- ``DMEM_MILVUS__URI`` in ``extra_env`` (or the environment) wins over all of these.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import orjson

from milvus.server import EmbeddedMilvusServer
from schemas.errors import ConfigError, ServiceUnavailable
from streams.admin import ensure_topics
from streams.auth import load_tokens
from streams.local.announce import announce_stack, hold_data_dir, withdraw
from streams.local.embedded import EmbeddedBroker, free_port, wait_for_port
from streams.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]


#: files the local stack and its processes create are readable by their owner only:
#: memories, logs (which quote records) and the broker's data are the user's
PRIVATE_UMASK = 0o077


def open_private(path: Path) -> BinaryIO:
    """Open a log for appending, created owner-only (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return open(fd, "ab")  # noqa: SIM115 - the caller hands it to a child and closes it


class WorkerProcess:
    """One `dmem worker` subprocess with its own environment."""

    def __init__(
        self, role: str, env: dict[str, str], log_path: Path, code_root: Path | None = None
    ) -> None:
        self.role = role
        self.env = env
        self.log_path = log_path
        #: the checkout whose code the worker runs (default: this one); a benchmark
        #: compares another revision's worker on the same broker and store with it
        self.code_root = code_root or REPO_ROOT
        #: ``-m`` puts the working directory first on sys.path: another checkout's worker
        #: runs from it; this one's from the caller's directory (relative paths hold)
        self.cwd = code_root
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = str(self.code_root) + os.pathsep + env.get("PYTHONPATH", "")
        # faust logs to stdout, block-buffered into a file: unbuffered, a worker that
        # is killed still leaves every line it logged (its assignments, its last error)
        env["PYTHONUNBUFFERED"] = "1"
        log = open_private(self.log_path)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streams.worker", "--role", self.role],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.cwd,
            start_new_session=True,
            umask=PRIVATE_UMASK,  # the Milvus Lite file, faust's data dir: owner only
        )
        log.close()  # the child holds its own descriptor

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: a crash, for fault-injection tests."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        return self.proc.returncode


def store_reachable(port: int) -> bool:
    """Whether the worker on ``port`` answers ``/health`` with 200 (its store is
    reachable); False on any other answer or none."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2.0) as r:
            return int(r.status) == 200
    except (OSError, ValueError):
        return False


class LocalStack:
    """Broker + data dir + workers; settings for clients come from `settings`."""

    def __init__(
        self,
        data_dir: Path,
        roles: tuple[str, ...] = ("write",),
        extra_env: dict[str, str] | None = None,
        broker_bootstrap: str | None = None,
        milvus: str = "lite",
        kafka_port: int | None = None,
        http_port: int | None = None,
    ) -> None:
        if milvus not in ("lite", "server", "auto"):
            raise ValueError("milvus must be 'lite', 'server' or 'auto'")
        #: fixed ports of the embedded broker and the first worker's HTTP API (None: a
        #: free one each start)
        self.kafka_port, self.http_port = kafka_port, http_port
        self.data_dir = data_dir.resolve()
        self.milvus = milvus
        self.milvus_server: EmbeddedMilvusServer | None = None
        self.roles = roles
        self.extra_env = dict(extra_env or {})
        self.broker: EmbeddedBroker | None = None
        self.bootstrap = broker_bootstrap
        self.workers: list[WorkerProcess] = []
        self.web_ports: list[int] = []

    def env(self, web_port: int) -> dict[str, str]:
        env = {
            "DMEM_KAFKA__BROKER": f"kafka://{self.bootstrap}",
            "DMEM_DATA_DIR": str(self.data_dir),
            "DMEM_WEB_PORT": str(web_port),
            # the broker keeps no control topic across a restart: the refusals of what
            # was forgotten live beside the data instead
            "DMEM_MILVUS__TOMBSTONE_FILE": str(self.data_dir / "tombstones.jsonl"),
        }
        if not self.auth_configured:
            # the embedded stack listens on 127.0.0.1 only: no HTTP tokens unless the
            # user (environment) or the caller (extra_env) configures them; the Host,
            # Origin and Content-Type guards (streams.webguard) still hold
            env["DMEM_AUTH__DISABLED"] = "true"
        env.update(self.extra_env)
        return env

    @property
    def auth_configured(self) -> bool:
        """Whether the user or the caller set any ``DMEM_AUTH__*``: then it is used as is."""
        return any(k.startswith("DMEM_AUTH__") for k in (*self.extra_env, *os.environ))

    def auth_summary(self) -> str:
        """One line for the first screen: is HTTP auth on, and with how many tokens."""
        a = self.settings.auth
        if a.disabled:
            how = "DMEM_AUTH__DISABLED" if self.auth_configured else "no DMEM_AUTH__TOKENS set"
            return f"off ({how}: any local process may read and write every tenant)"
        n = len(load_tokens(a.tokens, a.tokens_file))
        if not n:
            return "on, no tokens configured: every /v1 request gets 401"
        return (f"on ({n} token{'s' if n != 1 else ''}; send Authorization: Bearer <token>;"
                " the embedded broker has no ACLs: a local process can read its topics,"
                " see docs/security-kafka.md)")  # fmt: skip

    @property
    def settings(self) -> Settings:
        """Client-side view of the same settings the workers get."""
        saved = dict(os.environ)
        try:
            os.environ.update(self.env(0))
            return Settings()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def start_broker(self) -> str:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.bootstrap is None:
            if self.kafka_port:
                check_port_free(self.kafka_port, "--kafka-port")
            self.broker = EmbeddedBroker(self.kafka_port, log_path=self.data_dir / "broker.log")
            self.bootstrap = self.broker.start()
        asyncio.run(ensure_topics(self.settings))
        return self.bootstrap

    def start_worker(self, role: str, code_root: Path | None = None) -> WorkerProcess:
        if self.http_port and not self.web_ports:  # the first worker serves the fixed port
            check_port_free(self.http_port, "--http-port")
            port = self.http_port
        else:
            port = free_port()
        log = self.data_dir / f"worker-{role}-{port}.log"
        w = WorkerProcess(role, self.env(port), log, code_root)
        w.start()
        self.workers.append(w)
        self.web_ports.append(port)
        return w

    def restart_worker(self, worker: WorkerProcess) -> WorkerProcess:
        """Start ``worker``'s role again on the same web port (the addresses `dmem up`
        printed and announced stay true), logging to a new file beside the dead
        one's (which keeps its last lines)."""
        i = self.workers.index(worker)
        port = self.web_ports[i]
        n = sum(1 for _ in self.data_dir.glob(f"worker-{worker.role}-{port}*.log"))
        log = self.data_dir / f"worker-{worker.role}-{port}.restart{n}.log"
        # the same checkout, run from the same directory (relative paths hold)
        w = WorkerProcess(worker.role, self.env(port), log, worker.cwd)
        w.start()
        self.workers[i] = w
        return w

    def wait_ready(
        self, worker: WorkerProcess, timeout_s: float = 90.0, store_grace_s: float = 30.0
    ) -> None:
        """Wait until the worker's web server answers (it starts with the app), then
        until its ``/health`` says the store is reachable, for at most ``store_grace_s``.

        The worker connects to Milvus in the background (a worker started during an
        outage still comes up and says so), and its roles' consumers join their groups
        at the same time, so the port can open before the store is connected: a
        caller told "ready" then would get 503s. Past the grace the worker counts as
        started anyway: it is up, and its ``/health`` reports the outage."""
        port = self.web_ports[self.workers.index(worker)]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not worker.alive:
                raise ServiceUnavailable(
                    f"worker {worker.role} exited early; see {worker.log_path}:\n"
                    + tail(worker.log_path)
                )
            if wait_for_port("127.0.0.1", port, 0.5):
                break
        else:
            raise ServiceUnavailable(f"worker {worker.role} not ready after {timeout_s}s")
        grace = time.monotonic() + min(store_grace_s, max(deadline - time.monotonic(), 0.0))
        while time.monotonic() < grace and worker.alive:
            if store_reachable(port):
                return
            time.sleep(0.1)

    def milvus_mode(self) -> str:
        """What `start_milvus` will run: "external", "server" or "lite"."""
        if "DMEM_MILVUS__URI" in self.extra_env or os.environ.get("DMEM_MILVUS__URI"):
            return "external"
        if self.milvus == "lite":
            return "lite"
        server = EmbeddedMilvusServer(self.data_dir / "milvus-server")
        try:
            server.check_installed()
        except ConfigError:
            if self.milvus == "server":
                raise
            return "lite"
        if (
            self.milvus == "auto"
            and (self.data_dir / "milvus.db").exists()
            and not (self.data_dir / "milvus-server").exists()
        ):
            return "lite"
        return "server"

    def start_milvus(self, timeout_s: float = 180.0) -> str:
        """Start the embedded Milvus server when the mode asks for it; returns the mode."""
        mode = self.milvus_mode()
        if mode == "server":
            # loopback only: milvus has no authentication here, so nothing off this
            # machine may reach it (milvus.server: its own network namespace + a relay)
            self.milvus_server = EmbeddedMilvusServer(
                self.data_dir / "milvus-server", stop_grace_s=5, loopback_only=True
            )
            self.extra_env["DMEM_MILVUS__URI"] = self.milvus_server.start(timeout_s=timeout_s)
            if self.milvus_server.isolation_error:
                print(
                    "warning: the embedded Milvus server listens on every interface, without "
                    f"authentication ({self.milvus_server.isolation_error}); firewall its ports "
                    "or use --milvus lite",
                    file=sys.stderr,
                    flush=True,
                )
        return mode

    @property
    def milvus_loopback(self) -> bool:
        """The embedded Milvus server runs and is reachable from this machine only."""
        srv = self.milvus_server
        return srv is not None and srv.running and srv.isolation_error is None

    def start(self) -> LocalStack:
        self.start_broker()
        self.start_milvus()
        for role in self.roles:
            self.wait_ready(self.start_worker(role))
        return self

    def stop_workers(self) -> None:
        for w in self.workers:
            w.stop()
        self.workers.clear()
        self.web_ports.clear()

    def stop(self) -> None:
        self.stop_workers()
        if self.milvus_server is not None:
            self.milvus_server.stop()
            self.milvus_server = None
            self.extra_env.pop("DMEM_MILVUS__URI", None)
        if self.broker is not None:
            self.broker.stop()
            self.broker = None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def check_port_free(port: int, what: str) -> None:
    """`ConfigError` naming ``what`` when 127.0.0.1:``port`` cannot be bound (another
    process listens there), before anything is started on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ConfigError(
                f"{what} {port}: 127.0.0.1:{port} is in use ({exc.strerror}); stop what "
                "listens there, or choose another port"
            ) from None


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def first_screen(info: Mapping[str, object]) -> str:
    """What `dmem up` prints: the addresses and how to publish from curl, Python, kcat."""
    http, kafka = info["http"], info["kafka"]
    # with auth on, the examples carry the header they need
    auth = str(info.get("auth", "")).startswith("on")
    bearer = " -H 'Authorization: Bearer <token>'" if auth else ""
    # the SDK signs its Kafka records with the token; without it they are dead letters
    token = ', token="<token>"' if auth else ""
    kcat = (
        "           (with auth on a record needs the SDK's signed credential: kcat's are\n"
        "            dead letters, reason unauthenticated; use the SDK or curl)\n"
        if auth
        else "           (needs librdkafka >= 2.2: `kcat -V`; older ones fail with "
        '"Read underflow",\n            see docs/operations/local.md; use curl then)\n'
    )
    reach = ""
    if info["milvus_mode"] == "server":
        reach = (", this machine only" if info.get("milvus_loopback")
                 else ", REACHABLE FROM OTHER MACHINES, no authentication")  # fmt: skip
    # dmem inspect / forget / search / import / wait find this stack by its state file
    # while no DMEM_KAFKA__BROKER / DMEM_MILVUS__URI names another; the export pins it
    if info["milvus_mode"] == "lite":
        where = ("  (Milvus Lite is this process's file: dmem inspect and forget need it stopped;\n"
                 "   use the HTTP API meanwhile)\n")  # fmt: skip
        milvus = f" DMEM_DATA_DIR={info['data_dir']}"
    else:
        where, milvus = "", f" DMEM_MILVUS__URI={info['milvus']}"
    operate = (f"Operate from another shell (dmem inspect, search, forget, import, wait\n"
               f"find this stack by themselves; to pin it, e.g. with several running:)\n"
               f"  export DMEM_KAFKA__BROKER={kafka}{milvus} DMEM_WEB_PORT="
               f"{str(http).rsplit(':', 1)[-1]}\n{where}")  # fmt: skip
    one = ('{"tenant":"t1","agent_id":"a1","episode_id":"e1","step":1,'
           '"observation":"door is open","action":"walk"}')  # fmt: skip
    return f"""dmem is up
  kafka   {kafka}   (topic dmem.transitions, key = agent_id)
  http    {http}   (OpenAPI: {http}/openapi.json)
  milvus  {info["milvus"]}   ({info["milvus_mode"]}{reach})
  ui      {info.get("ui", str(http) + "/ui/")}   (live page; token as for /v1)
  auth    {info.get("auth", "off")}
  data    {info["data_dir"]}

Publish a transition
  curl:    curl -sX POST {http}/v1/transitions -H 'Content-Type: application/json'{bearer} \\
             -d '{{"tenant":"t1","agent_id":"a1","episode_id":"e1","step":0,
                  "observation":"door is locked","action":"use key","reward":1.0}}'
  Python:  from dmem import SyncClient, Transition
           c = SyncClient("{kafka}", tenant="t1", http_url="{http}"{token})
           c.publish(Transition(tenant="t1", agent_id="a1", episode_id="e1", step=0,
                                observation="door is locked", action="use key", reward=1.0))
  kcat:    echo '{one}' \\
             | kcat -P -b {kafka} -t dmem.transitions -k a1
{kcat}Search
  curl:    curl -sX POST {http}/v1/search -H 'Content-Type: application/json'{bearer} \\
             -d '{{"tenant":"t1","query":"locked door","k":5}}'
{operate}(Ctrl-C to stop; data kept in {info["data_dir"]})"""


def run_up(data_dir: Path, as_json: bool, milvus: str = "auto", kafka_port: int | None = None,
           http_port: int | None = None) -> None:  # fmt: skip
    """`dmem up`: print the addresses, then run until SIGINT/SIGTERM. ``kafka_port`` /
    ``http_port``: fixed ports (a restart keeps the addresses clients were given)."""
    # one process with every role: Milvus Lite is a single-process file store
    stack = LocalStack(data_dir, roles=("all",), milvus=milvus, kafka_port=kafka_port,
                       http_port=http_port)  # fmt: skip
    hold_data_dir(stack.data_dir)  # one `dmem up` per data dir (released at exit)
    stopping = False
    announced: list[Path] = []

    def _stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        mode = stack.milvus_mode()
        if mode == "lite" and milvus == "auto":
            print(
                "note: Milvus Lite (the Milvus server wheel is not installed, or this data "
                "dir holds Lite data): searches slow down with the rows held; see "
                "docs/design/2026-12-01-embedded-milvus-server.md",
                file=sys.stderr,
                flush=True,
            )
        print(
            f"starting the embedded broker, Milvus ({mode}) and a worker with every role "
            f"(data in {stack.data_dir}; {'about 30 s' if mode == 'server' else 'seconds'}) ...",
            file=sys.stderr,
            flush=True,
        )
        stack.start()
        info = {
            "kafka": stack.bootstrap,
            "milvus": stack.settings.milvus_uri,
            "milvus_mode": mode,
            "milvus_loopback": stack.milvus_loopback,
            "http": f"http://127.0.0.1:{stack.web_ports[0]}",
            "roles": list(stack.roles),
            "data_dir": str(stack.data_dir),
        }
        info["ui"] = f"{info['http']}/ui/"  # the live page (streams.respond.ui)
        info["auth"] = stack.auth_summary()
        announced = announce_stack(stack.settings, info)
        if as_json:
            print(orjson.dumps(info).decode(), flush=True)
        else:
            print(first_screen(info), flush=True)
        while not stopping:
            srv = stack.milvus_server
            if srv is not None and not srv.running:
                # the workers keep its address: they see an outage, then the same store
                print(
                    f"embedded Milvus died; restarting it (logs: {srv.log_dir})",
                    file=sys.stderr,
                    flush=True,
                )
                try:
                    srv.restart()
                    print("embedded Milvus is back", file=sys.stderr, flush=True)
                except Exception as exc:  # noqa: BLE001 - keep supervising; tried again
                    print(f"embedded Milvus did not come back ({exc}); trying again in 10 s",
                          file=sys.stderr, flush=True)  # fmt: skip
                    time.sleep(10.0)
            for w in stack.workers:
                if not w.alive:
                    print(
                        f"worker {w.role} died; restarting (log: {w.log_path})",
                        file=sys.stderr,
                        flush=True,
                    )
                    stack.restart_worker(w)
                    break
            time.sleep(0.5)
    finally:
        withdraw(announced)
        stack.stop()
