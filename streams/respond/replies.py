"""Where a Kafka retrieval reply goes, and whether a request gets one.

With Kafka auth off a reply goes to the shared responses topic or to the
request's ``reply_topic`` (a topic under the responses topic's name). With it
on (`streams.auth.KafkaGuard`):

- a request without a valid credential for its tenant gets no reply at all
  (it is dead-lettered "unauthenticated" by the caller);
- a reply for tenant T goes to T's own topic, ``<responses>.<T>``
  (`schemas.credentials.reply_topic_for`), or to a ``reply_topic`` under it
  (``<responses>.<T>.<suffix>``), never to a topic another tenant reads: a
  deployment restricts ``<responses>.<T>`` (literal) and ``<responses>.<T>.``
  (prefixed) to T's principal with broker ACLs;
- the tenant's own topic is created on first use (idempotent; an existing one is
  kept). Suffixed reply topics are never created here: one request per name would
  otherwise let a tenant create topics without bound. The SDK creates its own.

The map of reply topics held open is bounded (least recently used dropped).
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from typing import Any

import faust
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from schemas import RetrievalRequest
from schemas.credentials import reply_topic_for
from schemas.errors import InvalidRecord
from streams.admin import kafka_client_kwargs
from streams.auth import KafkaGuard
from streams.codec import raw_topic
from streams.settings import Settings

log = logging.getLogger("dmem.respond")

#: reply topics held open at once
MAX_REPLY_TOPICS = 4096

#: what Kafka allows in a topic name
KAFKA_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


async def ensure_topic(settings: Settings, name: str, partitions: int = 1) -> None:
    """Create topic `name` unless it exists (errors are logged: the send reports them)."""
    k = settings.kafka
    admin = AIOKafkaAdminClient(**kafka_client_kwargs(k))
    try:
        await admin.start()
        if name in set(await admin.list_topics()):
            return
        await admin.create_topics(
            [NewTopic(name=name, num_partitions=partitions,
                      replication_factor=k.replication_factor)]
        )  # fmt: skip
    except TopicAlreadyExistsError:
        pass
    except (KafkaError, OSError) as exc:
        log.warning("reply topic %s not created: %s", name, exc)
    finally:
        await admin.close()


class KafkaReplies:
    """The reply topic of each request, per the module doc."""

    def __init__(self, app: faust.App, settings: Settings, guard: KafkaGuard) -> None:
        self.app = app
        self.settings = settings
        self.guard = guard
        self.responses = settings.topic("responses")
        self.topics: OrderedDict[str, faust.TopicT] = OrderedDict()
        self.unauthenticated = 0

    def admit(self, req: RetrievalRequest, msg: Any) -> bool:
        """Does this request carry a credential for its tenant? (Always, with auth off.)"""
        ok = self.guard.agent_ok(req.tenant, msg.key, msg.value, msg.headers)
        if not ok:
            self.unauthenticated += 1
        return ok

    def name(self, req: RetrievalRequest) -> str:
        """The reply topic's name; InvalidRecord for a reply_topic the request may not use."""
        if self.guard.enabled:
            own = reply_topic_for(self.responses, req.tenant)
            name = req.reply_topic or own
            if name != own and not name.startswith(own + "."):
                raise InvalidRecord(f"reply_topic must be {own!r} or start with {own + '.'!r}")
        else:
            name = req.reply_topic or self.responses
            if not name.startswith(self.responses):
                raise InvalidRecord(f"reply_topic must start with {self.responses!r}")
        if not KAFKA_TOPIC.fullmatch(name):  # an id may hold ":@/", a topic name may not
            raise InvalidRecord("reply_topic may hold only letters, digits and '._-'")
        return name

    async def topic(self, req: RetrievalRequest) -> faust.TopicT:
        name = self.name(req)
        topic = self.topics.get(name)
        if topic is not None:
            self.topics.move_to_end(name)
            return topic
        if self.guard.enabled and name == reply_topic_for(self.responses, req.tenant):
            await ensure_topic(self.settings, name)
        topic = self.topics[name] = raw_topic(self.app, name)
        while len(self.topics) > MAX_REPLY_TOPICS:
            self.topics.popitem(last=False)
        return topic


__all__ = ["KafkaReplies", "ensure_topic"]
