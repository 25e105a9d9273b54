"""Pure helpers of the Milvus store: expression rendering and schema derivation."""

from __future__ import annotations

import json

import pytest
from pymilvus import DataType

from milvus.expr import build_filter, ids_in, literal
from milvus.schema import PRIMARY_FIELD, VECTOR_FIELD, build_schema, field_specs
from schemas.errors import ConfigError, InvalidRecord
from schemas.models import MemoryRecord


@pytest.mark.parametrize(
    "value",
    ['a" || tenant != "', "a' or '1'=='1", 'a\\" or true', "line\nbreak\t", "é ☃ 🚀", "\x01"],
)
def test_string_literals_round_trip(value: str) -> None:
    lit = literal(value)
    assert lit.startswith('"') and lit.endswith('"')
    assert json.loads(lit) == value
    inner = lit[1:-1]
    # every double quote inside is escaped, so the literal cannot be closed early
    assert all(inner[i - 1] == "\\" for i, ch in enumerate(inner) if ch == '"')


def test_literal_rejects_non_scalars_and_nonfinite() -> None:
    for bad in (float("nan"), float("inf"), None, [1], {"a": 1}, "nul\x00"):
        with pytest.raises(InvalidRecord):
            literal(bad)
    assert literal(True) == "true" and literal(3) == "3" and literal(0.5) == "0.5"
    # Milvus reads -9223372036854775808 as -(9223372036854775808), beyond INT64
    for bad in (-(2**63), 2**63):
        with pytest.raises(InvalidRecord, match="integer"):
            literal(bad)
    assert literal(-(2**63) + 1) == str(-(2**63) + 1)


def test_build_filter() -> None:
    assert build_filter() == ""
    assert build_filter(tenant="acme") == 'tenant == "acme"'
    f = build_filter(
        tenant="acme",
        agent_id="a1",
        extra_filter={"valence": [1, -1], "created_ts": {">=": 5}, "metadata.task": "x"},
    )
    assert f == (
        '(tenant == "acme") && (agent_id == "a1") && (valence in [1, -1]) '
        '&& (created_ts >= 5) && (metadata["task"] == "x")'
    )


@pytest.mark.parametrize(
    "extra",
    [
        {"vector": 1},
        {"metadata": 1},
        {"nope": 1},
        {"step": "1"},
        {"step": True},
        {"step": {"or": 1}},
        {"step": {}},
        {"step": []},
        {"tenant": 1},
        {"metadata.": "x"},
    ],
)
def test_build_filter_rejects(extra: dict) -> None:
    with pytest.raises(InvalidRecord):
        build_filter(tenant="acme", extra_filter=extra)


def test_build_filter_rejects_empty_scope() -> None:
    with pytest.raises(InvalidRecord):
        build_filter(tenant="")
    with pytest.raises(InvalidRecord):
        build_filter(tenant="acme", agent_id="")


def test_ids_in() -> None:
    assert ids_in(["a", 'b"']) == 'id in ["a", "b\\""]'
    with pytest.raises(InvalidRecord):
        ids_in([])
    with pytest.raises(InvalidRecord):
        ids_in([""])


def test_schema_follows_memory_record() -> None:
    specs = {s.name: s for s in field_specs()}
    assert list(specs) == list(MemoryRecord.model_fields)
    assert PRIMARY_FIELD == "key" and VECTOR_FIELD == "vector"
    assert specs["id"].dtype == DataType.VARCHAR and specs["id"].max_length == 128
    assert specs["step"].dtype == DataType.INT64
    assert specs["reward"].dtype == DataType.DOUBLE
    assert specs["metadata"].dtype == DataType.JSON
    assert specs["utility"].required is False and specs["utility"].default == 0.0
    schema = build_schema(16)
    vec = next(f for f in schema.fields if f.name == "vector")
    assert vec.dtype == DataType.FLOAT_VECTOR and vec.params["dim"] == 16
    assert schema.primary_field.name == "key"
    # the storage key holds any tenant and any memory id the models accept, plus "|"
    assert specs["key"].max_length >= specs["tenant"].max_length + specs["id"].max_length + 1
    with pytest.raises(ConfigError):
        build_schema(0)
