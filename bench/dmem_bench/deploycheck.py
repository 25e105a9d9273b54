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
- every DMEM_* variable the chart's ConfigMap, the Deployments' plain ``env``
  values or the compose services set names a real setting and parses
  (`streams.settings.Settings`; JSON for map/list settings, as pydantic-settings
  reads them from the environment);
- HTTP API auth (`streams.auth`) per value set (`check_chart_auth`): with
  ``auth.enabled`` and tokens configured, every pod (every role: respond checks
  ``/v1`` with the tokens and every role derives the Kafka record keys from them) sets
  ``DMEM_AUTH__TOKENS_FILE`` to a file inside a read-only
  Secret volume whose key is ``auth.existingSecretKey`` of ``auth.existingSecret``
  (or ``tokens.json`` of the chart's Secret, which must hold exactly
  ``auth.tokens``, and then a ``checksum/auth`` pod annotation); with
  ``auth.enabled=false`` those pods set ``DMEM_AUTH__DISABLED=true``; no pod sets
  ``DMEM_AUTH__TOKENS`` inline, and no
  ConfigMap holds a ``DMEM_AUTH__TOKENS*`` key or any known token value.
  ``auth.enabled`` with no tokens is accepted: the pods fail closed (401);
- ``docker-compose.yml`` validates against the Compose Specification JSON schema
  bundled at ``charts/compose-spec.json`` and wires the required services
  (Kafka, Milvus with etcd and MinIO, one worker per role) to each other; every
  worker service gets ``DMEM_AUTH__TOKENS`` (a non-empty
  ``{token: [tenants]}`` after ``${VAR:-default}`` interpolation, the token taken
  from an environment variable, not written into the file) and do not disable auth.

The last stdout line with ``--json`` is one JSON object: ``ok``,
``chart_renders`` (value sets rendered), ``chart_value_sets``,
``manifests_valid``, ``manifests_invalid``, ``invalid`` (details),
``lint_errors``, ``lint_warnings``, ``env_errors``, ``auth_errors``, ``compose_valid``,
``compose_services``, ``compose_errors``, ``kube_versions``, ``helm_sdk``,
``elapsed_s``. Exit status 0 when everything passes, 1 otherwise, 2 when the
tools are missing (``pip install -e ./bench`` installs them).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_origin

import click

#: the checkout this harness runs from (``<repo>/bench/dmem_bench/deploycheck.py``): the
#: default chart and compose file are that checkout's
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CHART = REPO_ROOT / "charts" / "dmem"
DEFAULT_COMPOSE = REPO_ROOT / "docker-compose.yml"
DEFAULT_COMPOSE_SCHEMA = REPO_ROOT / "charts" / "compose-spec.json"
DEFAULT_KUBE_VERSIONS = ("1.29.0", "1.37.0")
RELEASE = "dmem"
NAMESPACE = "dmem"

# Services docker-compose.yml must define, and the worker roles among them.
COMPOSE_REQUIRED = ("kafka", "etcd", "minio", "milvus", "write", "respond", "jobs")
COMPOSE_ROLES = ("write", "respond", "jobs")
# Roles whose web server mounts the HTTP API (/v1/*; streams.app.build_app), and
# the compose services among them. The others serve only /health and /metrics.
# Where the chart mounts the tokens file (charts/dmem/templates/deployment.yaml).
AUTH_TOKENS_FILE = "/etc/dmem/auth/tokens.json"
CHART_AUTH_KEY = "tokens.json"

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
    """The deploy tools (helm-python-sdk, kubernetes-validate, jsonschema, PyYAML) is absent."""


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
    auth_errors: list[str] = field(default_factory=list)
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
            and not self.auth_errors
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
            f"{exc.name} is not installed; `pip install -e ./bench` (in a checkout) "
            "brings the deploy tools"
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
        parsed: Any = value
        for i, part in enumerate(path):
            fields = getattr(model, "model_fields", None)
            if fields is None or part not in fields:
                errors.append(f"{where}: {name} is not a dmem setting")
                break
            if i < len(path) - 1:
                model = fields[part].annotation
            elif get_origin(fields[part].annotation) in (dict, list, set, tuple):
                # pydantic-settings JSON-decodes complex values read from the environment
                try:
                    parsed = json.loads(value)
                except ValueError as exc:
                    errors.append(f"{where}: {name} is not valid JSON: {exc}")
                    break
        else:
            cur = nested
            for part in path[:-1]:
                cur = cur.setdefault(part, {})
            cur[path[-1]] = parsed
    if not errors:
        try:
            Settings(**nested)
        except ValidationError as exc:
            for err in exc.errors():
                loc = ".".join(str(x) for x in err.get("loc", ()))
                errors.append(f"{where}: {loc}: {err.get('msg')}")
    return errors


_INTERP = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?([-?])([^}]*))?\}")


def _interpolate(value: Any) -> str:
    """Compose-style ``${VAR:-default}`` with the default (the environment is not read);
    a required ``${VAR:?message}`` becomes ``<VAR>``."""
    return _INTERP.sub(lambda m: f"<{m.group(1)}>" if m.group(2) == "?" else m.group(3) or "",
                       str(value))  # fmt: skip


def _env_map_raw(env: Any) -> dict[str, str]:
    """A compose ``environment`` (map or ``KEY=value`` list) as written."""
    if isinstance(env, dict):
        return {str(k): "" if v is None else str(v) for k, v in env.items()}
    return dict(str(item).partition("=")[::2] for item in env or [])


def _env_map(env: Any) -> dict[str, str]:
    return {k: _interpolate(v) for k, v in _env_map_raw(env).items()}


# -- chart --------------------------------------------------------------------
def _role(container: dict[str, Any]) -> str | None:
    args = [str(a) for a in container.get("args") or []]
    return args[-1] if len(args) >= 2 and args[-2] == "--role" else None


def _token_maps(secrets: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    """Secret name -> tokens, for rendered Secrets holding a JSON token map."""
    found: dict[str, set[str]] = {}
    for name, s in secrets.items():
        for raw in (s.get("data") or {}).values():
            try:
                data = json.loads(base64.b64decode(str(raw), validate=True))
            except (ValueError, binascii.Error):
                continue
            if isinstance(data, dict):
                found.setdefault(name, set()).update(str(k) for k in data)
    return found


def _check_auth_pod(
    dep: dict[str, Any], auth: dict[str, Any], secrets: dict[str, dict[str, Any]]
) -> list[str]:
    """The tokens file of one /v1-serving pod: env -> read-only Secret volume -> key."""
    pod = dep["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    where = dep["metadata"]["name"]
    env = {e["name"]: e for e in c.get("env") or []}
    path = str((env.get("DMEM_AUTH__TOKENS_FILE") or {}).get("value") or "")
    if not path:
        return [f"{where}: auth.enabled with tokens but no DMEM_AUTH__TOKENS_FILE value"]
    mounts = [
        m
        for m in c.get("volumeMounts") or []
        if path.startswith(str(m.get("mountPath", "")).rstrip("/") + "/")
    ]
    if not mounts:
        return [f"{where}: DMEM_AUTH__TOKENS_FILE {path} is not inside a mounted volume"]
    m = mounts[0]
    errors = [] if m.get("readOnly") else [f"{where}: tokens volume {m['name']} is not readOnly"]
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    sec = (volumes.get(m["name"]) or {}).get("secret")
    if not sec:
        return [*errors, f"{where}: tokens volume {m['name']} is not a Secret volume"]
    rel = path[len(str(m["mountPath"]).rstrip("/")) + 1 :]
    items = sec.get("items")
    key = next((i["key"] for i in items if i.get("path") == rel), None) if items else rel
    existing = auth.get("existingSecret") or ""
    want_name = existing or None
    want_key = auth.get("existingSecretKey") if existing else CHART_AUTH_KEY
    if key != want_key:
        errors.append(f"{where}: {path} is key {key!r} of the Secret, expected {want_key!r}")
    name = sec.get("secretName")
    if want_name is not None and name != want_name:
        errors.append(f"{where}: tokens Secret is {name!r}, expected {existing!r}")
    if want_name is None:
        chart_secret = secrets.get(str(name))
        raw = ((chart_secret or {}).get("data") or {}).get(CHART_AUTH_KEY)
        if raw is None:
            errors.append(f"{where}: chart Secret {name!r} with key {CHART_AUTH_KEY} not rendered")
        elif json.loads(base64.b64decode(str(raw))) != auth.get("tokens"):
            errors.append(f"{where}: chart Secret {name!r} does not hold auth.tokens")
        if "checksum/auth" not in (pod["metadata"].get("annotations") or {}):
            errors.append(f"{where}: no checksum/auth annotation (pods would keep old tokens)")
    return errors


def check_chart_auth(values: dict[str, Any], docs: list[dict[str, Any]], where: str) -> list[str]:
    """HTTP API auth wiring of one rendered value set (see the module docstring)."""
    auth = values.get("auth") or {}
    enabled = bool(auth.get("enabled", True))
    configured = enabled and bool(auth.get("existingSecret") or auth.get("tokens"))
    secrets = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Secret"}
    maps = _token_maps(secrets)
    tokens = set(auth.get("tokens") or {}).union(*maps.values())
    errors: list[str] = []
    for doc in docs:
        name = f"{where} {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
        if doc.get("kind") == "ConfigMap":
            for k, v in (doc.get("data") or {}).items():
                if k.startswith("DMEM_AUTH__TOKENS"):
                    errors.append(f"{name}: {k} belongs in a Secret, not a ConfigMap")
                if any(tok in f"{k}={v}" for tok in tokens):
                    errors.append(f"{name}: {k} holds an HTTP API token")
        if doc.get("kind") != "Deployment":
            continue
        pod = doc["spec"]["template"]
        (c,) = pod["spec"]["containers"]
        env = {e["name"]: e for e in c.get("env") or []}
        if "DMEM_AUTH__TOKENS" in env:
            errors.append(f"{name}: DMEM_AUTH__TOKENS in the pod spec; mount a tokens file")
        disabled = str((env.get("DMEM_AUTH__DISABLED") or {}).get("value", "")).lower()
        if not enabled:
            if disabled != "true":
                errors.append(f"{name}: auth.enabled=false but DMEM_AUTH__DISABLED is not true")
            if "DMEM_AUTH__TOKENS_FILE" in env:
                errors.append(f"{name}: auth.enabled=false but a tokens file is set")
            continue
        if "DMEM_AUTH__DISABLED" in env:
            errors.append(f"{name}: auth.enabled but DMEM_AUTH__DISABLED is set")
        if configured:
            errors.extend(f"{where} {e}" for e in _check_auth_pod(doc, auth, secrets))
    return errors


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
                merged: dict[str, Any] = chart.merge_values(values)
            except helm.HelmError as exc:
                report.render_errors.append(f"{name}: {exc}")
                continue
            report.chart_renders += 1
            docs = _split_manifests(yaml, rendered)
            rendered_all[name] = [d for _, d in docs]
            report.auth_errors.extend(
                check_chart_auth(merged, rendered_all[name], f"chart[{name}]")
            )
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
                elif kind == "Deployment":
                    for c in doc["spec"]["template"]["spec"]["containers"]:
                        plain = {
                            e["name"]: str(e["value"]) for e in c.get("env") or [] if "value" in e
                        }
                        report.env_errors.extend(
                            check_dmem_env(plain, f"chart[{name}] {doc['metadata']['name']} env")
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
        errors.extend(compose_auth(role, svc.get("environment"), env))
        errors.extend(check_dmem_env(env, f"compose[{role}]"))
    for name in COMPOSE_REQUIRED:
        if not (services[name].get("healthcheck") or {}).get("test"):
            errors.append(f"{name}: no healthcheck")
    errors.extend(compose_ports(services))
    return errors


def compose_auth(role: str, raw: Any, env: dict[str, str]) -> list[str]:
    """A worker service has the tokens (respond checks /v1 with them, every role derives
    the Kafka record keys from them), from an environment variable."""
    if env.get("DMEM_AUTH__DISABLED", "").lower() in ("1", "true", "yes", "on"):
        return [f"{role}: DMEM_AUTH__DISABLED set"]
    if "DMEM_AUTH__TOKENS" not in env:
        return [f"{role}: sets no DMEM_AUTH__TOKENS (/v1 would answer 401, Kafka records "
                "would go unsigned)"]  # fmt: skip
    try:
        tokens = json.loads(env["DMEM_AUTH__TOKENS"])
    except ValueError as exc:
        return [f"{role}: DMEM_AUTH__TOKENS is not JSON after interpolation: {exc}"]
    if (
        not isinstance(tokens, dict)
        or not tokens
        or not all(
            k and isinstance(v, list) and v and all(isinstance(x, str) for x in v)
            for k, v in tokens.items()
        )
    ):
        return [f"{role}: DMEM_AUTH__TOKENS must be a non-empty {{token: [tenants]}}"]
    raw_value = str(_env_map_raw(raw).get("DMEM_AUTH__TOKENS", ""))
    if not _INTERP.search(raw_value):
        return [f"{role}: DMEM_AUTH__TOKENS is written into the file; take it from ${{VAR}}"]
    if any(m.group(2) == "-" and m.group(3) for m in _INTERP.finditer(raw_value)):
        return [f"{role}: DMEM_AUTH__TOKENS has a default token; require it with ${{VAR:?...}}"]
    return []


def compose_ports(services: dict[str, Any]) -> list[str]:
    """Every published port is bound to the host's loopback: nothing on all interfaces."""
    errors: list[str] = []
    for name, svc in services.items():
        for port in svc.get("ports") or []:
            host_ip = port.get("host_ip") if isinstance(port, dict) else None
            if not isinstance(port, dict):
                parts = _interpolate(port).split(":")
                host_ip = ":".join(parts[:-2]) if len(parts) >= 3 else None
            if host_ip not in ("127.0.0.1", "::1", "[::1]"):
                errors.append(f"{name}: port {port} is published on every interface; "
                              "bind it to 127.0.0.1")  # fmt: skip
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
        f"auth: {len(report.auth_errors)} errors",
        f"compose: {'valid' if report.compose_valid else 'INVALID'}; services "
        f"{', '.join(report.compose_services)}",
    ]
    for title, items in (
        ("render error", report.render_errors),
        ("invalid", report.invalid),
        ("lint", report.lint_messages),
        ("settings", report.env_errors),
        ("auth", report.auth_errors),
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
    help="the Helm chart folder (the default is the checkout's)",
)
@click.option(
    "--compose",
    "compose_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=DEFAULT_COMPOSE,
    show_default=True,
    help="the compose file (the default is the checkout's)",
)
@click.option(
    "--compose-schema",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=DEFAULT_COMPOSE_SCHEMA,
    show_default=True,
    help="the Compose Specification JSON schema (the default is the checkout's)",
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
