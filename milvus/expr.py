"""Milvus boolean expressions built only from validated, escaped values.

Callers never pass expression text: they pass structured values (a tenant, an
agent id, a dict of field filters) and this module renders them.

Why escaping and not ``filter_params`` templates: neither Milvus Lite 3.2 nor
Milvus 2.3 understands templated expressions (``tenant == {t}`` is a parse error
on both; templates arrived in Milvus 2.5). String literals are therefore rendered
as double-quoted strings with JSON escaping (``\\"``, ``\\\\``, ``\\n``,
``\\uXXXX`` for control characters, non-ASCII kept as UTF-8), which both parsers
decode exactly back to the original value (Go ``strconv.Unquote`` semantics).
Field names are checked against the schema, operators against a whitelist, and
numbers must be finite, so a hostile value can only ever be a literal.

``extra_filter`` grammar (all terms are AND-ed)::

    {"valence": 1}                        field == value
    {"action": ["left", "right"]}         field in [...]
    {"created_ts": {">=": 1, "<": 9}}     comparisons (==, !=, >, >=, <, <=)
    {"metadata.task": "budget"}           metadata["task"] == "budget" (JSON key)
    {"metadata.user.task": "b"}           metadata["user"]["task"] == "b" (nested path)
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from pymilvus import DataType

from milvus.schema import field_specs
from schemas.errors import InvalidRecord
from schemas.limits import INT64_MAX

__all__ = ["and_all", "build_filter", "eq", "ids_in", "json_contains_any", "literal"]

_OPS = frozenset({"==", "!=", ">", ">=", "<", "<="})
_FIELDS = {s.name: s for s in field_specs()}
_JSON_FIELD = "metadata"
MAX_IN_LIST = 16_384
Scalar = str | int | float | bool


def literal(value: Any) -> str:
    """Render one scalar as an expression literal (strings escaped, numbers finite)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if abs(value) > INT64_MAX:  # Milvus parses -2^63 as -(2^63): out of range
            raise InvalidRecord(f"integer outside what a filter can hold: {value}")
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRecord(f"non-finite number in filter: {value!r}")
        return repr(value)
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidRecord("NUL character in filter value")
        return json.dumps(value, ensure_ascii=False)
    raise InvalidRecord(f"unsupported filter value type {type(value).__name__}")


def _check_type(field: str, dtype: DataType, value: Any) -> None:
    ok: bool
    if dtype == DataType.VARCHAR:
        ok = isinstance(value, str)
    elif dtype == DataType.INT64:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif dtype in (DataType.DOUBLE, DataType.FLOAT):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif dtype == DataType.BOOL:
        ok = isinstance(value, bool)
    else:
        ok = False
    if not ok:
        raise InvalidRecord(f"filter on {field!r}: {type(value).__name__} value does not fit")


def _target(key: str) -> tuple[str, DataType | None]:
    """(rendered field reference, dtype or None for JSON) for a filter key."""
    if not isinstance(key, str):
        raise InvalidRecord("filter keys must be strings")
    if key.startswith(_JSON_FIELD + "."):
        sub = key[len(_JSON_FIELD) + 1 :]
        if not sub or len(sub) > 128:
            raise InvalidRecord(f"bad metadata key in filter: {key!r}")
        # dotted keys are nested JSON paths: metadata.user.k -> metadata["user"]["k"]
        path = "".join(f"[{literal(part)}]" for part in sub.split("."))
        if any(not part for part in sub.split(".")):
            raise InvalidRecord(f"bad metadata key in filter: {key!r}")
        return f"{_JSON_FIELD}{path}", None
    spec = _FIELDS.get(key)
    if spec is None or spec.vector or spec.dtype == DataType.JSON:
        raise InvalidRecord(f"cannot filter on {key!r}")
    return key, spec.dtype


def eq(field: str, value: Scalar) -> str:
    ref, dtype = _target(field)
    if dtype is not None:
        _check_type(field, dtype, value)
    return f"{ref} == {literal(value)}"


def ids_in(ids: Iterable[str], field: str = "id") -> str:
    """``id in ["a", "b"]`` with every id escaped."""
    items = [literal(_as_id(i)) for i in ids]
    if not items:
        raise InvalidRecord("empty id list")
    return f"{field} in [{', '.join(items)}]"


def json_contains_any(key: str, values: Iterable[Scalar]) -> str:
    """``json_contains_any(metadata["a"]["b"], [...])``: a JSON array at `key` (a
    ``metadata.`` path) holding any of `values` (escaped literals)."""
    ref, dtype = _target(key)
    if dtype is not None:
        raise InvalidRecord(f"json_contains_any needs a metadata path, not {key!r}")
    items = [literal(v) for v in values]
    if not items or len(items) > MAX_IN_LIST:
        raise InvalidRecord(f"json_contains_any needs 1..{MAX_IN_LIST} values")
    return f"json_contains_any({ref}, [{', '.join(items)}])"


def _as_id(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRecord(f"memory ids must be non-empty strings (got {value!r})")
    return value


def _term(key: str, cond: Any) -> str:
    ref, dtype = _target(key)

    def check(v: Any) -> None:
        if dtype is not None:
            _check_type(key, dtype, v)
        else:
            literal(v)  # JSON values: any scalar, still validated

    if isinstance(cond, Mapping):
        if not cond:
            raise InvalidRecord(f"empty condition for {key!r}")
        parts = []
        for op, v in cond.items():
            if op not in _OPS:
                raise InvalidRecord(f"operator {op!r} not allowed (use one of {sorted(_OPS)})")
            check(v)
            parts.append(f"{ref} {op} {literal(v)}")
        return " && ".join(parts)
    if isinstance(cond, list | tuple | set | frozenset):
        values = list(cond)
        if not values or len(values) > MAX_IN_LIST:
            raise InvalidRecord(f"'in' list for {key!r} must have 1..{MAX_IN_LIST} values")
        for v in values:
            check(v)
        return f"{ref} in [{', '.join(literal(v) for v in values)}]"
    check(cond)
    return f"{ref} == {literal(cond)}"


def and_all(terms: Iterable[str]) -> str:
    parts = [t for t in terms if t]
    if not parts:
        return ""
    if len(parts) == 1:
        return parts[0]
    return " && ".join(f"({p})" for p in parts)


def build_filter(
    tenant: str | None = None,
    agent_id: str | None = None,
    extra_filter: Mapping[str, Any] | None = None,
) -> str:
    """The AND of tenant, agent and extra filter terms ('' when there are none)."""
    terms: list[str] = []
    if tenant is not None:
        terms.append(eq("tenant", _nonempty("tenant", tenant)))
    if agent_id is not None:
        terms.append(eq("agent_id", _nonempty("agent_id", agent_id)))
    for key, cond in (extra_filter or {}).items():
        terms.append(_term(key, cond))
    return and_all(terms)


def _nonempty(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRecord(f"{name} must be a non-empty string (got {value!r})")
    return value
