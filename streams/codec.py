"""Faust codecs: the orjson codec (name ``"orjson"``) and raw byte topics."""

from __future__ import annotations

from typing import Any

import faust
from faust.serializers import codecs

from schemas.codec import dumps, loads

#: the attribute of a faust app holding its `streams.auth.KafkaGuard` (set by `build_app`)
GUARD_ATTR = "dmem_guard"


class OrjsonCodec(codecs.Codec):
    def _dumps(self, obj: Any) -> bytes:
        return dumps(obj)

    def _loads(self, s: bytes) -> Any:
        return loads(s)


def register() -> None:
    codecs.register("orjson", OrjsonCodec())


class _SignedTopic(faust.Topic):
    """A raw topic whose sends carry the service's signature (`KafkaGuard.sign`).

    The guard is a class attribute of a subclass made per guard, so faust's
    clones of the topic (built from the class) keep signing.
    """

    guard: Any = None

    async def send(self, *, key: Any = None, value: Any = None, headers: Any = None,
                   **kwargs: Any) -> Any:  # fmt: skip
        if headers is None and isinstance(value, bytes):
            headers = self.guard.sign(key, value)
        return await super().send(key=key, value=value, headers=headers, **kwargs)


def raw_topic(app: faust.App, name: str) -> faust.TopicT:
    """Bytes in, bytes out: decoding (and dead-lettering) is ours. With Kafka auth
    on, what the service sends on it is signed."""
    guard = getattr(app, GUARD_ATTR, None)
    if guard is None or not guard.enabled:
        return app.topic(name, key_serializer="raw", value_serializer="raw")
    cls = type("SignedTopic", (_SignedTopic,), {"guard": guard})
    return cls(app, topics=[name], key_serializer="raw", value_serializer="raw")
