"""How a running `dmem up` can be found: one small JSON state file per stack.

`dmem up` writes its addresses (``kafka``, ``milvus``, ``http``, ``ui``, ``data_dir``,
``topic_prefix``, ``app_id``, ``auth_disabled``, ``pid``) to ``<data dir>/up.json``
and to ``<runtime dir>/<pid>.json`` (``DMEM_RUNTIME_DIR``, default
``~/.cache/dmem/up``), and removes both when it stops. Tools on the same machine
(`dmem report`, and the commands that talk to a deployment: `dmem search`, `wait`,
`mcp`, `topics`, `import`, `inspect`, `forget`) read them instead of asking the user to
repeat the ports and the data dir in ``DMEM_*`` variables. No token is ever written:
with auth configured the page asks for one. A file whose process is gone (a killed
`dmem up`), or whose broker port does not answer, is stale and ignored.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from schemas.errors import ConfigError
from streams.auth import service_key_id
from streams.local.embedded import wait_for_port

STATE_NAME = "up.json"
#: held (``flock``) by the `dmem up` that runs on a data dir, for its whole life
LOCK_NAME = "up.lock"


def announce(runtime_dir: Path, data_dir: Path, info: Mapping[str, Any]) -> list[Path]:
    """Write the state of this `dmem up` (pid = this process); returns the files written."""
    body = orjson.dumps({**info, "pid": os.getpid()}, option=orjson.OPT_INDENT_2)
    paths = [data_dir / STATE_NAME, runtime_dir.expanduser() / f"{os.getpid()}.json"]
    for p in paths:
        p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # owner only
        with open(fd, "wb") as f:
            f.write(body)
        tmp.replace(p)
    return paths


def announce_stack(settings: Any, info: Mapping[str, Any]) -> list[Path]:
    """`announce` for `dmem up`: its info plus what a client needs beyond the addresses."""
    extra = {
        "topic_prefix": settings.kafka.topic_prefix,
        "app_id": settings.app_id,
        "auth_disabled": settings.auth.disabled,
        # which key signs the stack's internal records (None: Kafka auth off), so a
        # command that signs for the service (`dmem forget`, `dmem import`) can tell
        # whether its own settings sign alike before it acts
        "service_key_id": service_key_id(settings),
        "started_ms": int(time.time() * 1000),
    }
    return announce(settings.runtime_dir, settings.data_dir, {**info, **extra})


def hold_data_dir(data_dir: Path) -> int:
    """Take ``<data dir>/up.lock`` for this process's life (the kernel releases it when the
    process ends, even killed); returns its descriptor. `ConfigError` when another `dmem
    up` holds it: a second stack on one data dir cannot open the first one's Milvus Lite
    file (every search 503) and, stopping, would remove the first one's ``up.json``."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        other = read_state(data_dir / STATE_NAME)
        who = f" (pid {other['pid']}, HTTP {other.get('http')})" if other else ""
        raise ConfigError(
            f"data dir {data_dir} is in use by another dmem up{who}: stop it first, or "
            "give another --data-dir"
        ) from None
    return fd


def withdraw(paths: list[Path]) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


def alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True  # exists, another user's
    return True


def read_state(path: Path) -> dict[str, Any] | None:
    """A state file's content, or None when missing, unreadable or stale."""
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not alive(data.get("pid")) or "kafka" not in data:
        return None
    host, _, port = str(data["kafka"]).rpartition(":")
    if not port.isdigit() or not wait_for_port(host or "127.0.0.1", int(port), 0.5):
        return None  # the pid was reused by another process: the broker is gone
    return data


def running(runtime_dir: Path) -> list[dict[str, Any]]:
    """Every live `dmem up` announced in ``runtime_dir``, newest first."""
    d = runtime_dir.expanduser()
    if not d.is_dir():
        return []
    found = [s for p in d.glob("*.json") if (s := read_state(p)) is not None]
    return sorted(found, key=lambda s: -int(s.get("started_ms") or 0))


def the_running(runtime_dir: Path, choose: str) -> dict[str, Any] | None:
    """The one live `dmem up` announced in ``runtime_dir``, None when none runs;
    `ConfigError` listing them when several do, each as ``choose`` formats its data dir
    (the option or variable that picks it)."""
    found = running(runtime_dir)
    if len(found) > 1:
        listed = "; ".join(f"{choose.format(s['data_dir'])} (kafka {s['kafka']}, pid {s['pid']})"
                           for s in found)  # fmt: skip
        raise ConfigError(f"{len(found)} `dmem up` stacks are running, pass one of: {listed}")
    return found[0] if found else None


def client_env(state: Mapping[str, Any]) -> dict[str, str]:
    """The ``DMEM_*`` variables that point a client at the announced stack."""
    env = {
        "DMEM_KAFKA__BROKER": f"kafka://{state['kafka']}",
        "DMEM_DATA_DIR": str(state["data_dir"]),
    }
    if state.get("milvus"):  # a server URI or the Lite file's path
        env["DMEM_MILVUS__URI"] = str(state["milvus"])
    if state.get("topic_prefix"):
        env["DMEM_KAFKA__TOPIC_PREFIX"] = str(state["topic_prefix"])
    if state.get("app_id"):
        env["DMEM_APP_ID"] = str(state["app_id"])
    return env
