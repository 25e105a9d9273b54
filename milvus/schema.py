"""The Milvus collection schema, derived from ``schemas.models.MemoryRecord``.

Mapping (one place, so a new field in ``MemoryRecord`` reaches Milvus by itself):

=====================  ==========================================================
``str``                VARCHAR, ``max_length`` from ``json_schema_extra["milvus"]``
                       (default 512); ``{"primary": True}`` marks the primary key
                       (``key`` = ``storage_key(tenant, id)``, see below)
``int``                INT64
``float``              DOUBLE (rewards/RPEs are small numbers, precision is cheap)
``bool``               BOOL
``list[float]``        FLOAT_VECTOR with ``{"vector": True}``; dim given at runtime
``dict``               JSON
=====================  ==========================================================

Indexes: COSINE on the vector (vectors are unit-norm, so COSINE == IP, but COSINE
stays correct if a caller forgets to normalise). Milvus Lite gets ``AUTOINDEX``
(Lite picks FAISS HNSW when faiss-cpu is installed, brute force otherwise); a
server gets HNSW (M=16, efConstruction=200). ``tenant`` gets a scalar index:
INVERTED (Lite, Milvus >= 2.4), falling back to Trie (Milvus 2.3).

Primary key: ``key`` = ``tenant|id``, not the memory id. Memory ids are
client-chosen and unique only within a tenant; with the id as the primary key,
tenant B's upsert of A's id would overwrite A's row (Lite: pk unique per
collection) and every delete/move by id would reach all tenants. ``id`` stays an
ordinary VARCHAR field holding the client-facing memory id.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic.fields import FieldInfo
from pymilvus import CollectionSchema, DataType, FieldSchema

from schemas.errors import ConfigError
from schemas.models import MemoryRecord

__all__ = [
    "FieldSpec",
    "HNSW_PARAMS",
    "ID_FIELD",
    "METRIC",
    "PARTITIONS",
    "PRIMARY_FIELD",
    "VECTOR_FIELD",
    "build_schema",
    "field_specs",
    "scalar_fields",
]

PARTITIONS: tuple[str, str] = ("core", "buffer")
METRIC = "COSINE"
HNSW_PARAMS: dict[str, int] = {"M": 16, "efConstruction": 200}
DEFAULT_VARCHAR = 512


@dataclass(frozen=True)
class FieldSpec:
    name: str
    dtype: DataType
    py_type: type
    primary: bool = False
    vector: bool = False
    max_length: int | None = None
    default: Any = None
    required: bool = True


def _base_type(annotation: Any) -> tuple[type, type | None]:
    """(outer type, element type) for an annotation: ``list[float]`` -> (list, float)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _base_type(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _base_type(args[0])
        raise ConfigError(f"union type {annotation!r} has no Milvus mapping")
    if origin is not None:
        params = typing.get_args(annotation)
        return origin, (params[0] if params else None)
    return annotation, None


def _hints(info: FieldInfo) -> dict[str, Any]:
    extra = info.json_schema_extra
    if isinstance(extra, dict):
        hint = extra.get("milvus")
        if isinstance(hint, dict):
            return dict(hint)
    return {}


def _spec(name: str, info: FieldInfo) -> FieldSpec:
    hints = _hints(info)
    outer, elem = _base_type(info.annotation)
    required = info.is_required()
    default = None if required else info.get_default(call_default_factory=True)
    common: dict[str, Any] = {"name": name, "required": required, "default": default}
    if hints.get("vector"):
        if outer is not list or elem is not float:
            raise ConfigError(f"vector field {name!r} must be list[float]")
        return FieldSpec(dtype=DataType.FLOAT_VECTOR, py_type=list, vector=True, **common)
    if outer is bool:
        return FieldSpec(dtype=DataType.BOOL, py_type=bool, **common)
    if outer is int:
        return FieldSpec(dtype=DataType.INT64, py_type=int, **common)
    if outer is float:
        return FieldSpec(dtype=DataType.DOUBLE, py_type=float, **common)
    if outer is str:
        return FieldSpec(
            dtype=DataType.VARCHAR,
            py_type=str,
            primary=bool(hints.get("primary")),
            max_length=int(hints.get("max_length", DEFAULT_VARCHAR)),
            **common,
        )
    if outer is dict:
        return FieldSpec(dtype=DataType.JSON, py_type=dict, **common)
    raise ConfigError(f"field {name!r}: type {info.annotation!r} has no Milvus mapping")


def field_specs() -> tuple[FieldSpec, ...]:
    """One ``FieldSpec`` per ``MemoryRecord`` field, in declaration order."""
    specs = tuple(_spec(n, i) for n, i in MemoryRecord.model_fields.items())
    if sum(s.primary for s in specs) != 1:
        raise ConfigError("MemoryRecord must mark exactly one primary field")
    if sum(s.vector for s in specs) != 1:
        raise ConfigError("MemoryRecord must mark exactly one vector field")
    return specs


_SPECS = field_specs()
PRIMARY_FIELD: str = next(s.name for s in _SPECS if s.primary)
VECTOR_FIELD: str = next(s.name for s in _SPECS if s.vector)
#: the client-facing memory id (unique within a tenant; the primary key folds in the tenant)
ID_FIELD = "id"


def scalar_fields() -> list[str]:
    """All field names except the vector and the storage key (the default ``output_fields``)."""
    return [s.name for s in _SPECS if not s.vector and not s.primary]


def build_schema(dim: int, description: str = "dmem memories") -> CollectionSchema:
    """The CollectionSchema for vectors of dimension ``dim``."""
    if not isinstance(dim, int) or dim < 1 or dim > 32_768:
        raise ConfigError(f"vector dim must be a positive int (got {dim!r})")
    fields = []
    for s in _SPECS:
        kw: dict[str, Any] = {}
        if s.dtype == DataType.VARCHAR:
            kw["max_length"] = s.max_length
        if s.vector:
            kw["dim"] = dim
        if s.primary:
            kw["is_primary"] = True
            kw["auto_id"] = False
        fields.append(FieldSchema(s.name, s.dtype, **kw))
    return CollectionSchema(fields, description=description, enable_dynamic_field=False)


def vector_index_params(is_lite: bool) -> tuple[str, dict[str, Any]]:
    """(index_type, params) for the vector field."""
    if is_lite:
        return "AUTOINDEX", {}
    return "HNSW", dict(HNSW_PARAMS)


def search_params(is_lite: bool, k: int) -> dict[str, Any]:
    """Per-request search params: HNSW ``ef`` must be >= k."""
    if is_lite:
        return {"metric_type": METRIC, "params": {}}
    return {"metric_type": METRIC, "params": {"ef": max(64, 2 * k)}}
