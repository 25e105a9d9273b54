"""mkdocs hooks: reference pages rendered from the code, so they cannot drift from it.

Each reference page holds one marker that `on_page_markdown` replaces:

- ``<!-- dmem:settings -->``: every field of `streams.settings.Settings`, recursively
  through the nested models, with its ``DMEM_*`` variable, type, default, constraints
  and description (the field's ``description``, else the comment above it in the source).
- ``<!-- dmem:cli -->``: every command of the click group `dmem.cli.main`, walked
  recursively, with its ``--help`` text. A sub-command that cannot be loaded (for
  example a plugin whose distribution is not installed) is listed with the reason.
- ``<!-- dmem:openapi -->``: the respond role's HTTP API from
  `streams.respond.openapi.openapi_document`; the document itself is published
  beside the page as ``reference/openapi.json``.
- ``<!-- dmem:topics -->`` and ``<!-- dmem:schemas -->``: the topic registry
  (`schemas.topics.TOPICS`) and the JSON Schema of every exported payload
  (`schemas.export.json_schemas`).

The hooks import the project from the repository root (put on ``sys.path`` here).
An import that fails stops the build: a reference that silently renders nothing
would be worse than no build.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import logging
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MARKERS = ("settings", "cli", "openapi", "topics", "schemas", "design")
DESIGN_DIR = ROOT / "docs" / "design"
DESIGN_NAV = "Design records"
OPENAPI_JSON = "reference/openapi.json"
log = logging.getLogger("mkdocs.hooks.references")


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except Exception as exc:  # any failure must stop the build, loudly
        raise PluginError(
            f"docs/hooks/references.py: cannot import {module} ({type(exc).__name__}: {exc}); "
            "build the docs from the repository root with the project's dependencies "
            "installed (`pip install -e '.[docs]'`, or scripts/setup.sh)"
        ) from exc


def _cell(text: Any) -> str:
    """One Markdown table cell: no newlines, pipes escaped outside code spans (inside
    them Python-Markdown keeps a pipe as it is, and would show the backslash)."""
    s = " ".join(str(text).split())
    parts = re.split(r"(`+[^`]*`+)", s)
    return "".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def _code(text: Any) -> str:
    s = " ".join(str(text).split())
    if not s:
        return '`""`'
    tick = "``" if "`" in s else "`"
    return f"{tick}{s}{tick}"


# --------------------------------------------------------------------------- settings

#: Meanings of the fields that carry neither a ``description`` nor a comment in
#: `streams.settings`. A field's own ``description`` wins; an entry that names no field
#: stops the build (so a rename cannot leave a stale line here), and a field with no
#: meaning from any source is a warning (an error under ``--strict``).
FALLBACK = {
    "app_id": "prefix of the consumer groups (`<app_id>-write`, `-respond`, ...) and faust app id",
    "data_dir": "Milvus Lite file (`milvus.db`) and local state",
    "web_host": "address the worker's web server binds (`0.0.0.0` in containers)",
    "web_port": "port of `/health`, `/metrics` and, on respond workers, the HTTP API",
    "log_level": "log level of the worker",
    "kafka.broker": "bootstrap servers, `kafka://host:port` (several joined by `;` or `,`)",
    "kafka.topic_prefix": "prefix of every topic name",
    "kafka.partitions": "partitions of the topics `dmem topics create` makes",
    "kafka.replication_factor": "replication factor of created topics",
    "kafka.security_protocol": "passed to aiokafka and faust",
    "kafka.sasl_mechanism": "SASL mechanism (with a SASL protocol)",
    "kafka.sasl_username": "SASL user",
    "kafka.sasl_password": "SASL password",
    "kafka.ssl_cafile": "CA bundle for TLS",
    "kafka.rebalance_timeout_s": "consumer-group rebalance timeout",
    "kafka.heartbeat_interval_s": "consumer-group heartbeat interval",
    "kafka.commit_interval_s": "auto-commit interval of the groups that auto-commit",
    "milvus.uri": "`http://host:19530` for a server; empty: Milvus Lite file under data_dir",
    "milvus.collection": "collection name",
    "milvus.token": "Milvus token (`user:password`)",
    "milvus.timeout_s": "timeout of one Milvus call",
    "encoder.name": "`minilm-static` (static embeddings distilled from the bundled MiniLM), "
    "`minilm` (torch MiniLM, contextual), `hash` (fast, no semantics), `passthrough` "
    "(state vectors)",
    "encoder.cache_size": "entries of the encoder's LRU cache of texts",
    "value.hidden": "hidden units of the per-tenant value MLP",
    "value.gamma": "discount of the TD(0) target",
    "value.lr": "learning rate of the value model",
    "value.polyak": "Polyak rate of the target network",
    "value.replay_size": "transitions kept in the replay reservoir",
    "value.replay_batch": "replayed transitions per update",
    "rpe.smoother_alpha": "EMA rate of the per-agent |z| level",
    "rpe.smoother_kappa": "weight of that level: s = |z| / (1 + kappa * EMA_agent(|z|))",
    "gate.q_low": "running quantile of the gate score under which a transition is dropped",
    "gate.q_high": "running quantile at or above which a transition goes to core",
    "gate.floor": "absolute floor of the thresholds, lowered to the mundane bulk's edge "
    "where the stream separates scores below it",
    "gate.outlier_k": "robust outlier rule: s >= median + k * 1.4826 * MAD goes to core",
    "gate.alpha": "slope of the stored gate value g = sigmoid(alpha * s - beta)",
    "gate.beta": "offset of the stored gate value",
    "gate.half_life": "observations after which old scores weigh half in the quantile sketch",
    "gate.warmup": "observations decided by the fixed warm-up rule while the sketch fills",
    "intrinsic.enabled": "mix the reward-free surprise into the gate score",
    "write.batch_size": "most records in one micro-batch",
    "write.checkpoint_every_s": "period of the operator-state checkpoints",
    "write.eligibility_horizon": "last transitions of an episode kept for hindsight writes",
    "write.eligibility_ttl_ms": "how long an episode's window waits for its outcome "
    "(ingestion time)",
    "write.retry_initial_s": "first backoff of a failed Milvus write",
    "write.retry_max_s": "longest backoff of a failed Milvus write",
    "respond.concurrency": "Kafka requests handled at once per respond worker",
    "respond.count_ttl_s": "cache lifetime of a tenant's memory count (sets lambda)",
    "respond.half_life_s": "half-life of the recency term of the ranking",
    "respond.lambda_hi": "lambda of a young tenant (at most `young` memories)",
    "respond.lambda_lo": "lambda of a mature tenant (at least `mature` memories)",
    "respond.young": "memories up to which a tenant is young",
    "respond.mature": "memories from which a tenant is mature",
    "respond.live_max_tenants": "tenants the live page's ring keeps (most recently active)",
    "jobs.credit_gamma": "discount of an outcome back to the step of a use",
    "maintenance.enabled": "run the dedup and decay jobs",
    "maintenance.decay_interval_s": "period of the decay pass",
    "maintenance.utility_weight": "weight of tanh(utility) in the decay priority",
    "maintenance.access_weight": "weight of the access term in the decay priority",
    "maintenance.access_half_life_s": "half-life of the access term (time since last access)",
    "maintenance.buffer_ttl_s": "buffer memories unseen this long (stream time) are evicted",
    "maintenance.max_actions_per_pass": "most moves and deletions one decay pass makes",
    "maintenance.access_flush_s": "period of the access-count flush to Milvus",
    "auth.disabled": "`true` turns HTTP auth off (the embedded `dmem up` and demo set it)",
    "auth.tokens_file": "JSON file of the same shape as `tokens` (merged)",
}


def _type_name(ann: Any) -> str:
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is typing.Literal:
        return " \\| ".join(_code(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [_type_name(a) for a in args if a is not type(None)]
        out = " or ".join(parts)
        return out + (" or null" if type(None) in args else "")
    if origin is not None:
        inner = ", ".join(_type_name(a) for a in args)
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{inner}]"
    if isinstance(ann, type):
        if issubclass(ann, Path):
            return "path"
        if issubclass(ann, enum.Enum):
            return " \\| ".join(_code(m.value) for m in ann)
        return ann.__name__
    return _cell(ann)


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return _code(str(value).lower())
    if isinstance(value, (dict, list)):
        return _code(json.dumps(value))
    if isinstance(value, enum.Enum):
        value = value.value
    return _code(value)


def _constraints(field: Any) -> str:
    names = {
        "ge": ">=",
        "gt": ">",
        "le": "<=",
        "lt": "<",
        "min_length": "min length",
        "max_length": "max length",
        "pattern": "matches",
    }
    out = []
    for meta in field.metadata:
        for attr, label in names.items():
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(f"{label} {_code(value)}" if attr == "pattern" else f"{label} {value}")
    return ", ".join(out)


def _source_comments(cls: type) -> dict[str, str]:
    """The ``#`` comment block right above each field of a class, keyed by field name."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    block: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        name = stripped.split(":", 1)[0]
        if block and ":" in stripped and name.isidentifier():
            out[name] = " ".join(block)
        block = []
    return out


def _doc(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    base_docs = {inspect.getdoc(b) for b in cls.__mro__[1:]}
    return "" if doc in base_docs else doc


def _settings_rows(
    model: Any, prefix: str, path: str, sections: list[str], count: list[int], seen: set[str]
) -> None:
    from pydantic import BaseModel

    comments = _source_comments(model)
    rows: list[str] = []
    nested: list[tuple[str, type]] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            nested.append((name, ann))
            continue
        env = f"{prefix}{name}".upper()
        dotted = f"{path}.{name}" if path else name
        seen.add(dotted)
        desc = field.description or comments.get(name, "") or FALLBACK.get(dotted, "")
        if not desc:
            log.warning("settings reference: %s has no description", dotted)
        if typing.get_origin(ann) in (dict, list) or ann in (dict, list):
            desc = (desc + " " if desc else "") + "(JSON in the environment variable)"
        rows.append(
            f"| {_code(env)} | {_type_name(ann)} | {_default(field)} | "
            f"{_cell(_constraints(field))} | {_cell(desc)} |"
        )
        count[0] += 1
    if rows:
        title = f"`{path}`" if path else "Top level"
        text = [f"## {title}", ""]
        doc = _doc(model)
        if doc and path:
            text += [doc, ""]
        text += [
            "| variable | type | default | allowed | meaning |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
        sections.append("\n".join(text))
    for name, sub in nested:
        _settings_rows(
            sub, f"{prefix}{name}__", f"{path}.{name}" if path else name, sections, count, seen
        )


def render_settings() -> str:
    settings = _import("streams.settings")
    cls = settings.Settings
    config = cls.model_config
    env_prefix = config.get("env_prefix", "")
    delim = config.get("env_nested_delimiter") or "__"
    if delim != "__":
        raise PluginError(f"Settings uses nested delimiter {delim!r}; update docs/hooks")
    sections: list[str] = []
    count = [0]
    seen: set[str] = set()
    _settings_rows(cls, env_prefix, "", sections, count, seen)
    stale = sorted(set(FALLBACK) - seen)
    if stale:
        raise PluginError(f"docs/hooks/references.py FALLBACK names no setting: {stale}")
    if count[0] == 0:
        raise PluginError("streams.settings.Settings has no fields: nothing to document")
    head = (
        f"{count[0]} settings, generated from `streams.settings.Settings`. "
        f"Environment variables use the prefix `{env_prefix}` and `{delim}` between "
        "a section and its field (`DMEM_GATE__Q_HIGH=0.95`).\n"
    )
    return head + "\n" + "\n".join(sections)


# --------------------------------------------------------------------------- CLI


def _walk(cmd: Any, ctx: Any, path: str, out: list[str]) -> None:
    import click

    out += [f"## `{path}`", ""]
    help_text = cmd.get_help(ctx)
    out += ["```text", help_text.rstrip(), "```", ""]
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            try:
                sub = cmd.get_command(ctx, name)
            except Exception as exc:  # a plugin that cannot be loaded is listed, not fatal
                out += [
                    f"## `{path} {name}`",
                    "",
                    f"Not available in this build: {type(exc).__name__}: {_cell(exc)}",
                    "",
                ]
                continue
            if sub is None or getattr(sub, "hidden", False):
                continue
            sub_ctx = click.Context(
                sub, info_name=name, parent=ctx, max_content_width=96, terminal_width=96
            )
            _walk(sub, sub_ctx, f"{path} {name}", out)


def render_cli() -> str:
    import click

    cli = _import("dmem.cli")
    main = getattr(cli, "main", None)
    if not isinstance(main, click.Command):
        raise PluginError("dmem.cli.main is not a click command")
    ctx = click.Context(main, info_name="dmem", max_content_width=96, terminal_width=96)
    out: list[str] = []
    _walk(main, ctx, "dmem", out)
    listed = set(main.list_commands(ctx)) if isinstance(main, click.Group) else set()
    missing = [name for name in getattr(cli, "HARNESS_COMMANDS", ()) if name not in listed]
    if missing:
        names = ", ".join(f"`dmem {name}`" for name in missing)
        out += [
            "## Commands of the benchmark harness",
            "",
            f"{names}: not installed where this site was built. They come from the "
            "harness of a checkout (`pip install -e ./bench`, done by "
            "`scripts/setup.sh`); run them with `--help` there.",
            "",
        ]
    return "\n".join(out)


# --------------------------------------------------------------------------- OpenAPI / JSON Schema


def _schema_type(s: dict[str, Any]) -> str:
    if "$ref" in s:
        name = s["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    for key in ("anyOf", "oneOf", "allOf"):
        if key in s:
            return " or ".join(_schema_type(x) for x in s[key])
    if "enum" in s:
        return " \\| ".join(_code(json.dumps(v)) for v in s["enum"])
    if "const" in s:
        return _code(json.dumps(s["const"]))
    t = s.get("type", "any")
    if isinstance(t, list):
        t = " or ".join(t)
    if t == "array" and "items" in s:
        return f"array of {_schema_type(s['items'])}"
    if t == "object" and isinstance(s.get("additionalProperties"), dict):
        return f"object of {_schema_type(s['additionalProperties'])}"
    return str(t)


def _schema_limits(s: dict[str, Any]) -> str:
    keys = (
        "minimum",
        "exclusiveMinimum",
        "maximum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "pattern",
    )
    return ", ".join(f"{k} {_code(s[k])}" for k in keys if k in s)


def _schema_table(name: str, schema: dict[str, Any]) -> list[str]:
    out = [f"### {name}", ""]
    if schema.get("description"):
        out += [schema["description"], ""]
    props = schema.get("properties", {})
    if not props:
        out += [f"Type: {_schema_type(schema)}", ""]
        return out
    required = set(schema.get("required", ()))
    out += ["| field | type | required | default | limits | meaning |", "|---|---|---|---|---|---|"]
    for field, s in props.items():
        default = _code(json.dumps(s["default"])) if "default" in s else ""
        out.append(
            f"| `{field}` | {_schema_type(s)} | {'yes' if field in required else ''} | "
            f"{default} | {_cell(_schema_limits(s))} | {_cell(s.get('description', ''))} |"
        )
    out.append("")
    return out


def _openapi_document() -> dict[str, Any]:
    openapi = _import("streams.respond.openapi")
    settings = _import("streams.settings")
    # pure defaults: the reference must not depend on the DMEM_* variables of the builder
    return openapi.openapi_document(settings.Settings.model_construct())


def _content(content: dict[str, Any]) -> str:
    return "; ".join(
        f"`{ctype}`: {_schema_type(c.get('schema', {}))}" for ctype, c in content.items()
    )


def render_openapi() -> str:
    doc = _openapi_document()
    out = [
        f"OpenAPI {doc['openapi']}, generated from `streams.respond.openapi`. A running "
        "respond worker serves the same document at `GET /openapi.json` (with the limits of "
        f"its own settings); this build's copy: [openapi.json](openapi.json).",
        "",
    ]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            out += [f"## {method.upper()} `{path}`", "", op.get("summary", ""), ""]
            if op.get("description"):
                out += [op["description"], ""]
            auth = "bearer token" if op.get("security") else "none (open)"
            out += [f"Auth: {auth}.", ""]
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | type | required |", "|---|---|---|---|"]
                out += [
                    f"| `{p['name']}` | {p['in']} | {_schema_type(p.get('schema', {}))} | "
                    f"{'yes' if p.get('required') else ''} |"
                    for p in params
                ]
                out.append("")
            body = op.get("requestBody")
            if body:
                out += [f"Request body: {_content(body.get('content', {}))}", ""]
            out += ["| status | meaning | body |", "|---|---|---|"]
            for code, resp in op.get("responses", {}).items():
                out.append(
                    f"| {code} | {_cell(resp.get('description', ''))} | "
                    f"{_content(resp.get('content', {}))} |"
                )
            out.append("")
    out += ["## Schemas", ""]
    for name, schema in doc.get("components", {}).get("schemas", {}).items():
        out += _schema_table(name, schema)
    return "\n".join(out)


def render_topics() -> str:
    topics = _import("schemas.topics")
    out = ["| topic (default prefix) | key | payload | compacted |", "|---|---|---|---|"]
    for logical, spec in topics.TOPICS.items():
        if spec.payload is not None:
            name = spec.payload.__name__
            payload = f"[{name}](#{name.lower()})"
        else:
            payload = "operator state (bytes)"
        out.append(
            f"| `{topics.topic_name(logical)}` | {_cell(spec.key)} | {payload} | "
            f"{'yes' if spec.compacted else ''} |"
        )
    return "\n".join(out) + "\n"


def render_schemas() -> str:
    export = _import("schemas.export")
    out: list[str] = []
    defs: dict[str, Any] = {}
    for name, schema in export.json_schemas().items():
        defs.update(schema.get("$defs", {}))
        out += _schema_table(name, schema)
    shown = set(export.json_schemas())
    extra = sorted(set(defs) - shown)
    if extra:
        out += ["## Nested types", ""]
        for name in extra:
            out += _schema_table(name, defs[name])
    return "\n".join(out)


# --------------------------------------------------------------------------- design records


def _design_records() -> list[Path]:
    """Every dated record, oldest first (``YYYY-MM-DD-topic.md``)."""
    return sorted(p for p in DESIGN_DIR.glob("*.md") if p.name[:4].isdigit())


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    raise PluginError(f"design record {path.name} has no '# title' line")


def render_design() -> str:
    rows = ["| date | record |", "|---|---|"]
    for path in _design_records():
        rows.append(f"| {path.name[:10]} | [{_cell(_title(path))}]({path.name}) |")
    return "\n".join(rows) + "\n"


RENDER = {
    "settings": render_settings,
    "cli": render_cli,
    "openapi": render_openapi,
    "topics": render_topics,
    "schemas": render_schemas,
    "design": render_design,
}


# --------------------------------------------------------------------------- mkdocs events


def on_config(config: Any) -> Any:
    """List every design record under its nav section, so a new record needs no nav edit."""
    for item in config.nav or []:
        if isinstance(item, dict) and DESIGN_NAV in item:
            item[DESIGN_NAV] = ["design/index.md"] + [f"design/{p.name}" for p in _design_records()]
            return config
    raise PluginError(f"mkdocs.yml nav has no '{DESIGN_NAV}' section")


def on_files(files: Files, config: Any) -> Files:
    text = json.dumps(_openapi_document(), indent=2, sort_keys=False) + "\n"
    files.append(File.generated(config, OPENAPI_JSON, content=text))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for marker in MARKERS:
        tag = f"<!-- dmem:{marker} -->"
        if tag in markdown:
            markdown = markdown.replace(tag, RENDER[marker]())
    return markdown
