"""Faust codecs: the orjson codec (name ``"orjson"``) and raw byte topics."""

from __future__ import annotations

from typing import Any

import faust
from faust.serializers import codecs

from schemas.codec import dumps, loads


class OrjsonCodec(codecs.Codec):
    def _dumps(self, obj: Any) -> bytes:
        return dumps(obj)

    def _loads(self, s: bytes) -> Any:
        return loads(s)


def register() -> None:
    codecs.register("orjson", OrjsonCodec())


def raw_topic(app: faust.App, name: str) -> faust.TopicT:
    """Bytes in, bytes out: decoding (and dead-lettering) is ours."""
    return app.topic(name, key_serializer="raw", value_serializer="raw")
