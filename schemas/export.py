"""JSON Schema export (`dmem schemas export DIR`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from schemas.models import (
    AccessCount,
    DeadLetter,
    EpisodeOutcome,
    Feedback,
    ForgetRequest,
    MemoryEvent,
    MemoryRecord,
    MemoryUsage,
    RetrievalRequest,
    RetrievalResponse,
    Transition,
    UtilityUpdate,
)

EXPORTED = (
    Transition,
    EpisodeOutcome,
    Feedback,
    ForgetRequest,
    RetrievalRequest,
    RetrievalResponse,
    MemoryUsage,
    MemoryEvent,
    UtilityUpdate,
    AccessCount,
    DeadLetter,
    MemoryRecord,
)


def json_schemas() -> dict[str, dict[str, Any]]:
    return {m.__name__: m.model_json_schema(by_alias=True) for m in EXPORTED}


def export_json_schemas(directory: str | Path) -> list[Path]:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, schema in json_schemas().items():
        path = out / f"{name}.schema.json"
        path.write_bytes(orjson.dumps(schema, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        paths.append(path)
    return paths
