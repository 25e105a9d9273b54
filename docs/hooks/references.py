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


def _doc(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    base_docs = {inspect.getdoc(b) for b in cls.__mro__[1:]}
    return "" if doc in base_docs else doc


def _settings_rows(
    model: Any, prefix: str, path: str, sections: list[str], count: list[int], seen: set[str]
) -> None:
    from pydantic import BaseModel

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
        desc = field.description or ""
        if not desc:
            raise PluginError(f"streams.settings: {dotted} has no Field(description=...)")
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
