"""Registers the orjson codec with faust (codec name ``"orjson"``)."""

from __future__ import annotations

from typing import Any

from faust.serializers import codecs

from schemas.codec import dumps, loads


class OrjsonCodec(codecs.Codec):
    def _dumps(self, obj: Any) -> bytes:
        return dumps(obj)

    def _loads(self, s: bytes) -> Any:
        return loads(s)


def register() -> None:
    codecs.register("orjson", OrjsonCodec())
