"""orjson encoding of payload models.

`encode`/`decode` are what every producer and consumer use; `streams.codec`
registers the same functions as the faust codec ``"orjson"``. Non-finite
floats are refused on encode (orjson would write ``null``), and decode keeps
strict validation so bad bytes become dead letters with the pydantic reason.
"""

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


def dumps(obj: Any) -> bytes:
    """Serialise plain data (dicts, lists, numpy scalars) with orjson."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)


def encode(model: BaseModel) -> bytes:
    """Model -> JSON bytes, by alias, without ``None`` noise."""
    return orjson.dumps(model.model_dump(mode="json", by_alias=True, exclude_none=True))


def decode(cls: type[M], data: bytes | str) -> M:
    """JSON bytes -> validated model; raises orjson.JSONDecodeError or ValidationError."""
    return cls.model_validate(orjson.loads(data))
