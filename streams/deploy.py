"""`dmem deploycheck`: render, lint and validate the deployment files offline.

What it checks (no cluster, no Docker, no network):
- the Helm chart ``charts/dmem`` is loaded, schema-checked (``values.schema.json``),
  rendered and linted by the real Helm engine: Helm's Go SDK through the PyPI
  package ``helm-python-sdk`` (``libhelm_c`` over ctypes, no ``helm`` binary),
  once with the default values and once per ``charts/dmem/ci/*-values.yaml``;
- every rendered manifest validates against the Kubernetes OpenAPI schemas
  bundled by ``kubernetes-validate`` (strict: unknown fields are errors), for
  each Kubernetes version asked for (default: the oldest and newest the chart
  targets). Kinds outside Kubernetes proper (the Prometheus Operator's
  ServiceMonitor) are checked against a small structural schema here, since
  no CRD schema ships offline;
- every DMEM_* variable the chart's ConfigMap or the compose services set names
  a real setting and parses (`streams.settings.Settings`);
- ``docker-compose.yml`` validates against the Compose Specification JSON schema
  bundled at ``charts/compose-spec.json`` and wires the required services
  (Kafka, Milvus with etcd and MinIO, one worker per role) to each other.

The last stdout line with ``--json`` is one JSON object: ``ok``,
``chart_renders`` (value sets rendered), ``chart_value_sets``,
``manifests_valid``, ``manifests_invalid``, ``invalid`` (details),
``lint_errors``, ``lint_warnings``, ``env_errors``, ``compose_valid``,
``compose_services``, ``compose_errors``, ``kube_versions``, ``helm_sdk``,
``elapsed_s``. Exit status 0 when everything passes, 1 otherwise, 2 when the
tools are missing (install the ``deploy`` extra).
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CHART = REPO_ROOT / "charts" / "dmem"
DEFAULT_COMPOSE = REPO_ROOT / "docker-compose.yml"
DEFAULT_COMPOSE_SCHEMA = REPO_ROOT / "charts" / "compose-spec.json"
DEFAULT_KUBE_VERSIONS = ("1.29.0", "1.37.0")
RELEASE = "dmem"
NAMESPACE = "dmem"

# Services docker-compose.yml must define, and the worker roles among them.
COMPOSE_REQUIRED = ("kafka", "etcd", "minio", "milvus", "write", "respond", "jobs")
COMPOSE_ROLES = ("write", "respond", "jobs")

# Structural checks for CRD kinds that have no offline schema.
CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "metadata": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            },
            "spec": {
                "type": "object",
                "required": ["selector", "endpoints"],
                "additionalProperties": False,
                "properties": {
                    "jobLabel": {"type": "string"},
                    "namespaceSelector": {
                        "type": "object",
                        "properties": {
                            "any": {"type": "boolean"},
                            "matchNames": {"type": "array", "items": {"type": "string"}},
                        },
                        "additionalProperties": False,
                    },
                    "selector": {
                        "type": "object",
                        "properties": {
                            "matchLabels": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                            "matchExpressions": {"type": "array"},
                        },
                        "additionalProperties": False,
                    },
                    "endpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "properties": {
                                "port": {"type": "string"},
                                "targetPort": {"type": ["string", "integer"]},
                                "path": {"type": "string"},
                                "scheme": {"enum": ["http", "https"]},
                                "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                                "scrapeTimeout": {
                                    "type": "string",
                                    "pattern": "^[0-9]+(ms|s|m|h)$",
                                },
                                "honorLabels": {"type": "boolean"},
                            },
                        },
                    },
                },
            },
        },
    }
}


class ToolsMissing(RuntimeError):
    """The deploy extra (helm-python-sdk, kubernetes-validate, jsonschema, PyYAML) is absent."""


@dataclass
class Report:
    chart_value_sets: list[str] = field(default_factory=list)
    chart_renders: int = 0
    render_errors: list[str] = field(default_factory=list)
    manifests_valid: int = 0
    manifests_invalid: int = 0
    invalid: list[str] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)
    lint_errors: int = 0
    lint_warnings: int = 0
    lint_messages: list[str] = field(default_factory=list)
    env_errors: list[str] = field(default_factory=list)
    compose_valid: bool = False
    compose_services: list[str] = field(default_factory=list)
    compose_errors: list[str] = field(default_factory=list)
    kube_versions: list[str] = field(default_factory=list)
    helm_sdk: str = ""
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.chart_renders == len(self.chart_value_sets) > 0
            and self.manifests_invalid == 0
            and self.manifests_valid > 0
            and self.lint_errors == 0
            and not self.env_errors
            and self.compose_valid
        )

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items()}
        d["ok"] = self.ok
        return d


def _tools() -> tuple[Any, Any, Any, Any]:
    try:
        import helm_python
        import jsonschema
        import kubernetes_validate
        import yaml
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ToolsMissing(
            f"{exc.name} is not installed; `pip install 'dmem[deploy]'` brings the deploy tools"
        ) from None
    utils = kubernetes_validate.utils
    if not hasattr(utils.schema_contents, "cache_info"):
        # it re-reads the 1.8 MB definitions file for every manifest; schemas are
        # read-only during validation, so one parse per file is enough
        utils.schema_contents = functools.lru_cache(maxsize=64)(utils.schema_contents)
    return helm_python, kubernetes_validate, jsonschema, yaml


# -- settings -----------------------------------------------------------------
def check_dmem_env(env: dict[str, str], where: str) -> list[str]:
    """Every DMEM_* variable must name a real setting and parse."""
    from pydantic import ValidationError

    from streams.settings import Settings

    errors: list[str] = []
    nested: dict[str, Any] = {}
    for name, value in env.items():
        if not name.startswith("DMEM_"):
            continue
        path = name[len("DMEM_") :].lower().split("__")
        model: Any = Settings
        for i, part in enumerate(path):
            fields = getattr(model, "model_fields", None)
            if fields is None or part not in fields:
                errors.append(f"{where}: {name} is not a dmem setting")
                break
            if i < len(path) - 1:
                model = fields[part].annotation
        else:
            cur = nested
            for part in path[:-1]:
                cur = cur.setdefault(part, {})
            cur[path[-1]] = value
    if not errors:
        try:
            Settings(**nested)
        except ValidationError as exc:
            for err in exc.errors():
                loc = ".".join(str(x) for x in err.get("loc", ()))
                errors.append(f"{where}: {loc}: {err.get('msg')}")
    return errors


_INTERP = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def _interpolate(value: Any) -> str:
    """Compose-style ``${VAR:-default}`` with the default (the environment is not read)."""
    return _INTERP.sub(lambda m: m.group(2) or "", str(value))


def _env_map(env: Any) -> dict[str, str]:
    if isinstance(env, dict):
        return {str(k): _interpolate("" if v is None else v) for k, v in env.items()}
    out: dict[str, str] = {}
    for item in env or []:
        k, _, v = str(item).partition("=")
        out[k] = _interpolate(v)
    return out


# -- chart --------------------------------------------------------------------
def _split_manifests(yaml: Any, rendered: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
    docs: list[tuple[str, dict[str, Any]]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt") or not text.strip():
            continue
        for doc in yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if doc:
                docs.append((path, doc))
    return docs


def check_chart(
    chart_dir: Path, kube_versions: tuple[str, ...], report: Report
) -> dict[str, list[dict[str, Any]]]:
    """Render + lint + validate; returns the manifests per value set (for tests)."""
    helm, kv, jsonschema, yaml = _tools()
    report.helm_sdk = helm.helm_sdk_version()
    report.kube_versions = list(kube_versions)
    value_sets: list[tuple[str, dict[str, Any] | None]] = [("default", None)]
    for f in sorted((chart_dir / "ci").glob("*-values.yaml")):
        value_sets.append((f.name, yaml.safe_load(f.read_text()) or {}))
    rendered_all: dict[str, list[dict[str, Any]]] = {}
    with helm.Chart.load(str(chart_dir)) as chart:
        for name, values in value_sets:
            report.chart_value_sets.append(name)
            try:
                chart.validate_schema(values)
                rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
            except helm.HelmError as exc:
                report.render_errors.append(f"{name}: {exc}")
                continue
            report.chart_renders += 1
            docs = _split_manifests(yaml, rendered)
            rendered_all[name] = [d for _, d in docs]
            for path, doc in docs:
                kind = str(doc.get("kind"))
                report.kinds[kind] = report.kinds.get(kind, 0) + 1
                problems = validate_manifest(kv, jsonschema, doc, kube_versions)
                if problems:
                    report.manifests_invalid += 1
                    meta = doc.get("metadata") or {}
                    report.invalid.extend(
                        f"{name} {path} {kind}/{meta.get('name')}: {p}" for p in problems
                    )
                else:
                    report.manifests_valid += 1
                if kind == "ConfigMap":
                    report.env_errors.extend(
                        check_dmem_env(
                            {k: str(v) for k, v in (doc.get("data") or {}).items()},
                            f"chart[{name}] ConfigMap",
                        )
                    )
            lint = helm.lint(str(chart_dir), values, namespace=NAMESPACE)
            for msg in lint.get("messages", []):
                sev = msg.get("severity", 0)
                if sev >= 3:
                    report.lint_errors += 1
                elif sev == 2:
                    report.lint_warnings += 1
                if sev >= 2:
                    report.lint_messages.append(f"{name}: {msg.get('path')}: {msg.get('error')}")
            for err in lint.get("errors", []) or []:
                report.lint_errors += 1
                report.lint_messages.append(f"{name}: {err}")
    return rendered_all


def validate_manifest(
    kv: Any, jsonschema: Any, doc: dict[str, Any], kube_versions: tuple[str, ...]
) -> list[str]:
    key = (str(doc.get("apiVersion")), str(doc.get("kind")))
    if key in CRD_SCHEMAS:
        v = jsonschema.Draft7Validator(CRD_SCHEMAS[key])
        return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc)]
    problems: list[str] = []
    for version in kube_versions:
        try:
            kv.validate(doc, version, strict=True)
        except kv.SchemaNotFoundError:
            problems.append(f"k8s {version}: no schema for {key[0]} {key[1]}")
        except kv.ValidationError as exc:
            where = "/".join(str(x) for x in getattr(exc, "absolute_path", []))
            problems.append(f"k8s {version}: {where}: {getattr(exc, 'message', exc)}")
    return problems


# -- compose ------------------------------------------------------------------
def check_compose(compose_file: Path, schema_file: Path, report: Report) -> dict[str, Any]:
    _, _, jsonschema, yaml = _tools()
    try:
        data = yaml.safe_load(compose_file.read_text())
        schema = json.loads(schema_file.read_text())
    except (OSError, ValueError) as exc:
        report.compose_errors.append(str(exc))
        return {}
    errors = report.compose_errors
    # the bundled revision declares draft 2019-09 under a non-standard URI
    validator = jsonschema.Draft201909Validator(schema)
    for e in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path)):
        errors.append(f"schema: {'/'.join(map(str, e.absolute_path)) or '.'}: {e.message[:300]}")
    services: dict[str, Any] = (data or {}).get("services") or {}
    report.compose_services = sorted(services)
    for name in COMPOSE_REQUIRED:
        if name not in services:
            errors.append(f"service {name!r} is missing")
    if not errors:
        errors.extend(compose_wiring(services))
    report.compose_valid = not errors
    return data if isinstance(data, dict) else {}


def _depends(svc: dict[str, Any]) -> dict[str, str]:
    dep = svc.get("depends_on") or {}
    if isinstance(dep, list):
        return {d: "service_started" for d in dep}
    return {k: (v or {}).get("condition", "service_started") for k, v in dep.items()}


def compose_wiring(services: dict[str, Any]) -> list[str]:
    """The dmem services reach Kafka and Milvus by service name and wait for them."""
    errors: list[str] = []
    if "milvus" in services and _depends(services["milvus"]).keys() < {"etcd", "minio"}:
        errors.append("milvus must depend on etcd and minio")
    for role in COMPOSE_ROLES:
        svc = services[role]
        env = _env_map(svc.get("environment"))
        cmd = svc.get("command") or []
        cmd = cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]
        if cmd[-2:] != ["--role", role]:
            errors.append(f"{role}: command must end with --role {role}, got {cmd}")
        broker = env.get("DMEM_KAFKA__BROKER", "")
        if not re.match(r"^kafka://kafka:\d+", broker):
            errors.append(f"{role}: DMEM_KAFKA__BROKER must point at the kafka service: {broker!r}")
        uri = env.get("DMEM_MILVUS__URI", "")
        if not re.match(r"^https?://milvus:19530$", uri):
            errors.append(f"{role}: DMEM_MILVUS__URI must point at the milvus service: {uri!r}")
        if env.get("DMEM_WEB_HOST") != "0.0.0.0":
            errors.append(f"{role}: DMEM_WEB_HOST must be 0.0.0.0 in a container")
        deps = _depends(svc)
        for need in ("kafka", "milvus"):
            if deps.get(need) != "service_healthy":
                errors.append(f"{role}: depends_on {need} must wait for service_healthy")
        if not svc.get("healthcheck"):
            errors.append(f"{role}: no healthcheck")
        errors.extend(check_dmem_env(env, f"compose[{role}]"))
    for name in COMPOSE_REQUIRED:
        if not (services[name].get("healthcheck") or {}).get("test"):
            errors.append(f"{name}: no healthcheck")
    return errors


# -- entry points -------------------------------------------------------------
def run_checks(
    chart_dir: Path = DEFAULT_CHART,
    compose_file: Path = DEFAULT_COMPOSE,
    compose_schema: Path = DEFAULT_COMPOSE_SCHEMA,
    kube_versions: tuple[str, ...] = DEFAULT_KUBE_VERSIONS,
) -> Report:
    t0 = time.perf_counter()
    report = Report()
    check_chart(chart_dir, kube_versions, report)
    check_compose(compose_file, compose_schema, report)
    report.elapsed_s = round(time.perf_counter() - t0, 3)
    return report


def _human(report: Report) -> str:
    lines = [
        f"helm sdk {report.helm_sdk}; kubernetes schemas {', '.join(report.kube_versions)}",
        f"chart: {report.chart_renders}/{len(report.chart_value_sets)} value sets rendered "
        f"({', '.join(report.chart_value_sets)})",
        f"manifests: {report.manifests_valid} valid, {report.manifests_invalid} invalid "
        f"({', '.join(f'{k} {n}' for k, n in sorted(report.kinds.items()))})",
        f"lint: {report.lint_errors} errors, {report.lint_warnings} warnings",
        f"compose: {'valid' if report.compose_valid else 'INVALID'}; services "
        f"{', '.join(report.compose_services)}",
    ]
    for title, items in (
        ("render error", report.render_errors),
        ("invalid", report.invalid),
        ("lint", report.lint_messages),
        ("settings", report.env_errors),
        ("compose", report.compose_errors),
    ):
        lines.extend(f"  {title}: {m}" for m in items)
    lines.append("OK" if report.ok else "FAILED")
    return "\n".join(lines)


@click.command("deploycheck")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object on the last line")
@click.option(
    "--chart",
    "chart_dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=DEFAULT_CHART,
    show_default=True,
)
@click.option(
    "--compose",
    "compose_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=DEFAULT_COMPOSE,
    show_default=True,
)
@click.option(
    "--compose-schema",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=DEFAULT_COMPOSE_SCHEMA,
    show_default=True,
)
@click.option(
    "--kube-version",
    "kube_versions",
    multiple=True,
    default=DEFAULT_KUBE_VERSIONS,
    show_default=True,
    help="Kubernetes version(s) to validate against (repeatable)",
)
def deploycheck(
    as_json: bool,
    chart_dir: Path,
    compose_file: Path,
    compose_schema: Path,
    kube_versions: tuple[str, ...],
) -> None:
    """Render + lint the Helm chart (real Helm engine); validate manifests and compose file."""
    try:
        report = run_checks(chart_dir, compose_file, compose_schema, tuple(kube_versions))
    except ToolsMissing as exc:
        click.echo(f"dmem: error: {exc}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(report.to_dict(), sort_keys=True))
    else:
        click.echo(_human(report))
    sys.exit(0 if report.ok else 1)
