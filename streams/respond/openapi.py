"""The OpenAPI 3.1 document of the respond role's HTTP API (``GET /openapi.json``).

Decisions:
- Generated, never hand-written: every request and response body is the JSON
  Schema pydantic derives from the `schemas` models (the stream's own payloads),
  collected under ``components/schemas`` with `pydantic.json_schema.models_json_schema`.
  OpenAPI 3.1 uses JSON Schema 2020-12, pydantic's dialect, so nothing is converted.
- Limits that are settings (``ingest.max_batch``) are written into the document
  of the running worker (``maxItems``), so the document tells the truth for that
  deployment.
- The document itself is open (like ``/health``): it holds no tenant data. Every
  ``/v1`` operation declares the bearer scheme; ``/health`` and ``/openapi.json``
  declare none.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from schemas import (
    BatchGetRequest,
    EpisodeOutcome,
    ErrorBody,
    Feedback,
    ForgetRequest,
    IngestAccepted,
    MemoryUsage,
    RetrievalRequest,
    RetrievalResponse,
    Transition,
)
from schemas.limits import LIMITS
from schemas.models import IDENT_PATTERN
from streams.settings import Settings

REF = "#/components/schemas/{model}"
_MODELS: list[tuple[type[BaseModel], JsonSchemaMode]] = [
    (Transition, "validation"),
    (EpisodeOutcome, "validation"),
    (Feedback, "validation"),
    (MemoryUsage, "validation"),
    (RetrievalRequest, "validation"),
    (ForgetRequest, "validation"),
    (BatchGetRequest, "validation"),
    (RetrievalResponse, "serialization"),
    (IngestAccepted, "serialization"),
    (ErrorBody, "serialization"),
]


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _errors(*codes: int) -> dict[str, Any]:
    why = {
        401: "missing or unknown bearer token", 403: "the token may not use this tenant",
        404: "no such memory for this tenant", 413: "too many records or too large a body",
        415: "the body is not application/json (ingest: or application/x-ndjson)",
        421: "a Host this server does not answer (web_allowed_hosts)",
        422: "invalid request: every reason in detail",
        429: "in-flight budget (or the tenant's share of it, or the tenant's search turns) "
             "full: retry after Retry-After seconds",
        503: "broker or store unavailable (the error names its kind, never its text): "
             "retry after Retry-After seconds (absent when retrying cannot help)",
    }  # fmt: skip
    out: dict[str, Any] = {}
    for c in codes:
        out[str(c)] = {"description": why[c], "content": _json(_ref(ErrorBody))}
        if c in (429, 503):
            out[str(c)]["headers"] = {
                "Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}
            }
    return out


def _ingest(model: type[BaseModel], what: str, max_batch: int) -> dict[str, Any]:
    one = _ref(model)
    return {"post": {
        "summary": f"Publish {what} (one object, a JSON array or NDJSON)",
        "description": (
            f"Validated with the `{model.__name__}` model, produced with acks=all; 202 "
            f"only after the broker acknowledged every record. At most {max_batch} "
            "records per request; one invalid record rejects the request (422)."),
        "operationId": f"ingest{model.__name__}",
        "security": [{"bearer": []}],
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": {"oneOf": [
                one, {"type": "array", "items": one, "minItems": 1, "maxItems": max_batch}]}},
            "application/x-ndjson": {"schema": {
                "type": "string", "description": f"one {model.__name__} JSON object a line"}},
        }},
        "responses": {"202": {"description": "acknowledged by the broker",
                              "content": _json(_ref(IngestAccepted))},
                      **_errors(401, 403, 413, 415, 422, 429, 503)},
    }}  # fmt: skip


#: the response header of reads: where the server's time went
timing = {"Server-Timing": {"schema": {"type": "string"}, "description": (
    "store;dur=<ms>, total;dur=<ms>: the store read (in its worker thread) and the whole "
    "handler")}}  # fmt: skip


def _tenant_param() -> dict[str, Any]:
    return {"name": "tenant", "in": "query", "required": True, "schema": {
        "type": "string", "minLength": 1, "maxLength": LIMITS.max_id_chars,
        "pattern": IDENT_PATTERN}}  # fmt: skip


def openapi_document(settings: Settings) -> dict[str, Any]:
    try:
        version = metadata.version("dmem")
    except metadata.PackageNotFoundError:  # a source tree without an install
        version = "0"
    _, defs = models_json_schema(_MODELS, ref_template=REF, by_alias=True)
    components = defs.get("$defs", {})
    memory = {
        "type": "object",
        "additionalProperties": True,
        "description": "a stored memory row (without its vector)",
    }
    stats = {
        "type": "object",
        "properties": {
            "tenant": {"type": "string"},
            "core": {"type": "integer"},
            "buffer": {"type": "integer"},
            "total": {"type": "integer"},
            "metrics_label": {
                "type": "string",
                "description": "the tenant's `tenant` label on /metrics",
            },
        },
    }
    forgotten = {
        "type": "object",
        "properties": {
            "tenant": {"type": "string"},
            "forgotten": {"type": "integer"},
            "folded_into": {
                "type": "string",
                "description": "the memory forgotten for a memory_id dedup folded into it "
                "(reads of that id answer with it)",
            },
        },
    }
    mid = {"name": "memory_id", "in": "path", "required": True, "schema": {"type": "string"}}
    memories = {
        "type": "object",
        "required": ["memories"],
        "properties": {
            "tenant": {"type": "string"},
            "memories": {"type": "array", "items": memory},
            "missing": {
                "type": "array",
                "items": {"type": "string"},
                "description": "asked ids neither stored nor folded (batch reads)",
            },
            "next_cursor": {
                "type": ["string", "null"],
                "description": "the next page's cursor; null on the last page",
            },
        },
    }
    event = {
        "type": "object",
        "additionalProperties": True,
        "required": ["kind", "ts"],
        "properties": {
            "kind": {
                "type": "string",
                "enum": [
                    "written",
                    "merged",
                    "moved",
                    "promoted",
                    "demoted",
                    "evicted",
                    "forgotten",
                    "credited",
                    "fed_back",
                ],
            },
            "ts": {"type": "integer", "description": "event time, ms"},
        },
    }
    history = {
        "type": "object",
        "properties": {
            "tenant": {"type": "string"},
            "memory_id": {"type": "string"},
            "events": {"type": "array", "items": event, "description": "oldest first"},
        },
    }

    def q(name: str, schema: dict[str, Any], what: str) -> dict[str, Any]:
        return {
            "name": name,
            "in": "query",
            "required": False,
            "schema": schema,
            "description": what,
        }

    list_params = [
        _tenant_param(),
        q(
            "limit",
            {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
            "memories per page",
        ),
        q("cursor", {"type": "string"}, "next_cursor of the previous page"),
        q("ids", {"type": "string"}, "comma-separated ids: a batch read instead of a page"),
        q("agent_id", {"type": "string"}, "one agent's memories"),
        q("partition", {"type": "string", "enum": ["core", "buffer"]}, "one partition"),
        q("valence", {"type": "integer", "enum": [-1, 0, 1]}, "sign of the reward"),
        q(
            "since_ms",
            {"type": "integer", "minimum": 0, "maximum": LIMITS.max_event_ms},
            "created at or after (event time)",
        ),
        q(
            "until_ms",
            {"type": "integer", "minimum": 0, "maximum": LIMITS.max_event_ms},
            "created at or before (event time)",
        ),
        q("min_utility", {"type": "number"}, "utility at least"),
        {
            "name": "meta",
            "in": "query",
            "required": False,
            "style": "deepObject",
            "explode": True,
            "schema": {"type": "object", "additionalProperties": True},
            "description": "metadata equality: meta.<key>=<value>, the value a JSON literal "
            '(3, true, "text") or plain text',
        },
    ]
    sec: list[dict[str, list[str]]] = [{"bearer": []}]
    paths: dict[str, Any] = {
        "/v1/transitions": _ingest(Transition, "transitions", settings.ingest.max_batch),
        "/v1/outcomes": _ingest(EpisodeOutcome, "episode outcomes", settings.ingest.max_batch),
        "/v1/feedback": _ingest(Feedback, "feedback", settings.ingest.max_batch),
        "/v1/usage": _ingest(MemoryUsage, "usage reports", settings.ingest.max_batch),
        "/v1/search": {"post": {
            "summary": "Search a tenant's memories (request_id optional)",
            "operationId": "search", "security": sec,
            "requestBody": {"required": True, "content": _json(_ref(RetrievalRequest))},
            "responses": {"200": {"description": "hits, best first",
                                  "content": _json(_ref(RetrievalResponse))},
                          **_errors(401, 403, 413, 415, 422, 429, 503)}}},
        "/v1/memories": {"get": {
            "summary": "A tenant's memories, newest first, one page at a time (the "
                       "search's filters); or several by id (ids=a,b)",
            "operationId": "listMemories", "security": sec, "parameters": list_params,
            "responses": {"200": {"description": "a page and the next page's cursor",
                                  "content": _json(memories), "headers": timing},
                          **_errors(401, 403, 422, 503)}}},
        "/v1/memories:batch_get": {"post": {
            "summary": "Several memories of a tenant by id (a folded id answers with its "
                       "survivor and folded_id)",
            "operationId": "batchGetMemories", "security": sec,
            "requestBody": {"required": True, "content": _json(_ref(BatchGetRequest))},
            "responses": {"200": {"description": "the rows found, and the ids missing",
                                  "content": _json(memories), "headers": timing},
                          **_errors(401, 403, 413, 415, 422, 503)}}},
        "/v1/memories/{memory_id}/history": {"get": {
            "summary": "What happened to one memory, oldest first",
            "operationId": "memoryHistory", "security": sec,
            "parameters": [mid, _tenant_param(),
                           q("limit", {"type": "integer", "minimum": 1,
                                       "maximum": LIMITS.max_history, "default": 200},
                             "the newest this many events")],
            "responses": {"200": {"description": "its events", "content": _json(history),
                                  "headers": timing},
                          **_errors(401, 403, 404, 422, 503)}}},
        "/v1/memories/{memory_id}": {
            "get": {"summary": "One memory of a tenant (a folded id: its survivor, with "
                               "folded_id)", "operationId": "getMemory",
                    "security": sec, "parameters": [mid, _tenant_param()],
                    "responses": {"200": {"description": "the row", "content": _json(memory),
                                          "headers": timing},
                                  **_errors(401, 403, 404, 422, 503)}},
            "delete": {"summary": "Forget one memory", "operationId": "deleteMemory",
                       "security": sec, "parameters": [mid, _tenant_param()],
                       "responses": {"200": {"description": "forgotten",
                                             "content": _json(forgotten)},
                                     **_errors(401, 403, 404, 422, 503)}}},
        "/v1/forget": {"post": {
            "summary": "Forget one memory or one agent's memories", "operationId": "forget",
            "security": sec,
            "requestBody": {"required": True, "content": _json(_ref(ForgetRequest))},
            "responses": {"200": {"description": "forgotten", "content": _json(forgotten)},
                          **_errors(401, 403, 413, 415, 422, 503)}}},
        "/v1/stats": {"get": {
            "summary": "A tenant's memory counts by partition", "operationId": "stats",
            "security": sec, "parameters": [_tenant_param()],
            "responses": {"200": {"description": "counts", "content": _json(stats)},
                          **_errors(401, 403, 422, 503)}}},
        "/v1/live": {"get": {
            "summary": "The live page's data: tenants with counts and gate thresholds, the "
                       "gate-score summary of one tenant, its newest decisions, dead letters",
            "operationId": "live", "security": sec,
            "parameters": [{**_tenant_param(), "required": False}],
            "responses": {"200": {"description": "the page's data", "content": _json(memory)},
                          **_errors(401, 403)}}},
        "/ui/": {"get": {
            "summary": "The live page (HTML shell, public; its data calls carry the token)",
            "operationId": "ui",
            "responses": {"200": {"description": "the page",
                                  "content": {"text/html": {"schema": {"type": "string"}}}}}}},
        "/metrics": {"get": {
            "summary": "Prometheus metrics", "operationId": "metrics",
            "responses": {"200": {"description": "text exposition format",
                                  "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        "/health": {"get": {"summary": "Liveness and readiness", "operationId": "health",
                            "responses": {"200": {"description": "healthy"},
                                          "503": {"description": "not ready"}}}},
    }  # fmt: skip
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "dmem respond API",
            "version": version,
            "description": "Search, read, forget and publish memories over HTTP.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
