"""Broker administration: reachability check, topic creation, group consumers and commits.

`check_broker` turns "nothing listens there" into one clear `BrokerUnavailable`
line naming the address, instead of faust retrying forever with tracebacks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaError,
    TopicAlreadyExistsError,
)

from schemas.errors import BrokerUnavailable
from schemas.topics import TOPICS, TopicSpec
from streams.settings import KafkaSettings, Settings


async def commit_or_replay(
    consumer: AIOKafkaConsumer, what: str, offsets: dict[Any, Any] | None = None
) -> bool:
    """Commit; a commit the group refused (it rebalanced meanwhile) is a warning, not a crash.

    A job slow enough to miss its poll interval (dedup searches on a loaded Milvus
    Lite, seen on a 10-conversation LoCoMo run) loses its partitions; the commit
    then raises and, unhandled, took the whole worker down. The records are not
    lost: the partitions' next owner re-reads them from the last commit, and every
    job's step is idempotent (dedup merges by id, credit updates by update id, the
    write path's upserts by storage key). ``offsets`` as for ``consumer.commit``.
    """
    try:
        await consumer.commit(offsets)
    except (CommitFailedError, IllegalStateError) as exc:
        logging.getLogger("dmem.admin").warning(
            "%s: commit refused (%s); the next owner re-reads the records", what, exc
        )
        return False
    return True


class ReadEnds:
    """Where one read "to the end" of some partitions stops: each partition's listed
    end (``end_offsets``), raised once to the high watermark of the first fetch that
    reports one, then fixed. The embedded broker's ListOffsets answers a record
    batch's base offset + 1 rather than its last offset + 1, while its fetches carry
    the true high watermark; on Apache Kafka the two agree, and fixing the end keeps
    a reader from chasing records appended after it started."""

    def __init__(self, listed: Mapping[TopicPartition, int]) -> None:
        self.ends = {tp: int(off) for tp, off in listed.items()}
        self._fixed: set[TopicPartition] = set()

    def of(self, consumer: Any, tp: TopicPartition) -> int:
        if tp not in self._fixed:
            hw = consumer.highwater(tp)
            if hw is not None:
                self.ends[tp] = max(self.ends.get(tp, 0), int(hw))
                self._fixed.add(tp)
        return self.ends.get(tp, 0)


def kafka_client_kwargs(k: KafkaSettings) -> dict[str, Any]:
    """Security settings passed through to every aiokafka client."""
    kw: dict[str, Any] = {
        "bootstrap_servers": k.bootstrap,
        "security_protocol": k.security_protocol,
    }
    if k.sasl_mechanism:
        kw.update(
            sasl_mechanism=k.sasl_mechanism,
            sasl_plain_username=k.sasl_username,
            sasl_plain_password=k.sasl_password,
        )
    if k.security_protocol in ("SSL", "SASL_SSL"):
        import ssl

        kw["ssl_context"] = ssl.create_default_context(cafile=k.ssl_cafile)
    return kw


def group_consumer(
    settings: Settings,
    topic: str | Sequence[str],
    group_suffix: str,
    *,
    auto_commit: bool = False,
    offset_reset: str = "earliest",
    fetch_max_wait_ms: int = 100,
    listener: ConsumerRebalanceListener | None = None,
    co_partitioned: bool = False,
) -> AIOKafkaConsumer:
    """A consumer in group ``<app_id>-<suffix>`` with the deployment's timeouts and security.

    Used by the roles that run plain aiokafka loops inside faust Services
    (responder, credit applier, maintenance).

    ``co_partitioned``: the topics share their keys' partitioning (`TopicSpec.partitions_of`)
    and a member reads the same partitions of each (range assignment, round robin only
    while a member that knows no other is in the group), so one process handles every
    record of a key.
    """
    k = settings.kafka
    consumer = AIOKafkaConsumer(
        group_id=settings.group(group_suffix),
        enable_auto_commit=auto_commit,
        auto_offset_reset=offset_reset,
        fetch_max_wait_ms=fetch_max_wait_ms,
        session_timeout_ms=int(k.session_timeout_s * 1000),
        heartbeat_interval_ms=int(k.heartbeat_interval_s * 1000),
        rebalance_timeout_ms=int(k.rebalance_timeout_s * 1000),
        partition_assignment_strategy=(
            (RangePartitionAssignor, RoundRobinPartitionAssignor)
            if co_partitioned
            else (RoundRobinPartitionAssignor,)
        ),
        **kafka_client_kwargs(k),
    )
    consumer.subscribe([topic] if isinstance(topic, str) else list(topic), listener=listener)
    return consumer


async def check_broker(k: KafkaSettings, timeout_s: float = 10.0) -> None:
    admin = AIOKafkaAdminClient(request_timeout_ms=int(timeout_s * 1000), **kafka_client_kwargs(k))
    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # our one-line error replaces aiokafka's log lines
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
    except (TimeoutError, KafkaError, OSError) as exc:
        raise BrokerUnavailable(
            f"cannot reach the Kafka broker at {k.bootstrap}: {exc or type(exc).__name__}"
        ) from None
    finally:
        quiet.setLevel(level)
        try:
            await admin.close()
        except Exception:  # noqa: BLE001 - closing a half-open client
            pass


def topic_configs(spec: TopicSpec) -> dict[str, str]:
    """The configs a dmem topic is created with (`schemas.topics.TopicSpec`)."""
    configs = {"cleanup.policy": "compact"} if spec.compacted else {}
    if spec.max_message_bytes is not None:
        configs["max.message.bytes"] = str(spec.max_message_bytes)
    return configs


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    """The partitions of `topic` a started consumer knows, asking the broker once more
    where its metadata does not have them yet (empty where the topic is not there)."""
    parts = consumer.partitions_for_topic(topic)
    if not parts:
        await consumer._client.force_metadata_update()  # noqa: SLF001
        parts = consumer.partitions_for_topic(topic)
    return set(parts or ())


async def partition_count(admin: AIOKafkaAdminClient, topic: str) -> int:
    """How many partitions the existing `topic` has (`BrokerUnavailable` where the
    broker does not say: a topic made with another count would break co-partitioning)."""
    for t in await admin.describe_topics([topic]):
        if t.get("topic") == topic and t.get("error_code", 0) == 0 and t.get("partitions"):
            return len(t["partitions"])
    raise BrokerUnavailable(f"the broker did not describe topic {topic}; try again")


async def ensure_topics(settings: Settings, timeout_s: float = 15.0) -> list[str]:
    """Create every dmem topic (idempotent); returns the names created now."""
    k = settings.kafka
    admin = AIOKafkaAdminClient(request_timeout_ms=int(timeout_s * 1000), **kafka_client_kwargs(k))
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
    except (TimeoutError, KafkaError, OSError) as exc:
        raise BrokerUnavailable(f"cannot reach the Kafka broker at {k.bootstrap}: {exc}") from None
    created: list[str] = []
    try:
        existing = set(await admin.list_topics())
        new = []
        for logical, spec in TOPICS.items():
            name = settings.topic(logical)
            if name in existing:
                continue
            configs = topic_configs(spec)
            like = settings.topic(spec.partitions_of) if spec.partitions_of else None
            # only a topic there already is described (a describe of a missing one may
            # make it, with the broker's default count); one made now has ours
            count = await partition_count(admin, like) if like and like in existing else None
            new.append(
                NewTopic(
                    name=name,
                    num_partitions=count or k.partitions,
                    replication_factor=k.replication_factor,
                    topic_configs=configs,
                )
            )
        for topic in new:
            try:
                await admin.create_topics([topic])
                created.append(topic.name)
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()
    return created
