"""Deployment files: the Helm chart rendered and linted by the real Helm engine
(helm-python-sdk, Helm's Go SDK), manifests validated against the Kubernetes
schemas (kubernetes-validate), docker-compose.yml against the Compose schema,
and the `dmem deploycheck --json` contract. No cluster and no Docker needed.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dmem_bench.deploycheck import (
    AUTH_TOKENS_FILE,
    DEFAULT_CHART,
    DEFAULT_COMPOSE,
    DEFAULT_COMPOSE_SCHEMA,
    DEFAULT_KUBE_VERSIONS,
    REPO_ROOT,
    Report,
    _env_map,
    check_chart,
    check_chart_auth,
    check_compose,
)

helm = pytest.importorskip("helm_python")

CI_FILES = sorted((DEFAULT_CHART / "ci").glob("*-values.yaml"))
ROLES = ("write", "respond", "jobs", "all")


@pytest.fixture(scope="module")
def chart() -> tuple[Report, dict[str, list[dict[str, Any]]]]:
    report = Report()
    rendered = check_chart(DEFAULT_CHART, DEFAULT_KUBE_VERSIONS, report)
    return report, rendered


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def values_for(name: str) -> dict[str, Any]:
    """The merged values of a value set, as Helm sees them."""
    with helm.Chart.load(str(DEFAULT_CHART)) as c:
        override = (
            None if name == "default" else yaml.safe_load((DEFAULT_CHART / "ci" / name).read_text())
        )
        merged: dict[str, Any] = c.merge_values(override)
        return merged


def test_ci_value_sets_exist() -> None:
    names = {f.name for f in CI_FILES}
    assert {
        "external-kafka-sasl-values.yaml",
        "hpa-servicemonitor-values.yaml",
        "minimal-all-values.yaml",
    } <= names


def test_chart_renders_lints_and_validates_every_value_set(chart: Any) -> None:
    report, rendered = chart
    assert report.chart_value_sets == ["default", *[f.name for f in CI_FILES]]
    assert report.render_errors == []
    assert report.chart_renders == len(report.chart_value_sets)
    assert report.manifests_invalid == 0, report.invalid
    assert report.manifests_valid == sum(len(d) for d in rendered.values())
    assert report.lint_errors == 0, report.lint_messages
    assert report.env_errors == []
    assert report.helm_sdk.startswith("v")


def test_each_enabled_role_has_deployment_service_pdb_and_probes(chart: Any) -> None:
    _, rendered = chart
    for name, docs in rendered.items():
        values = values_for(name)
        enabled = [r for r in ROLES if values["roles"][r]["enabled"]]
        deployments = by_kind(docs, "Deployment")
        services = by_kind(docs, "Service")
        pdbs = by_kind(docs, "PodDisruptionBudget")
        assert sorted(deployments) == sorted(f"dmem-{r}" for r in enabled), name
        assert sorted(services) == sorted(deployments), name
        if values["podDisruptionBudget"]["enabled"]:
            assert sorted(pdbs) == sorted(deployments), name
        else:
            assert not pdbs
        cm = by_kind(docs, "ConfigMap")["dmem"]
        assert cm["data"]["DMEM_WEB_HOST"] == "0.0.0.0"
        assert cm["data"]["DMEM_KAFKA__BROKER"].startswith("kafka://")
        for role in enabled:
            dep = deployments[f"dmem-{role}"]
            pod = dep["spec"]["template"]
            assert re.fullmatch(r"[0-9a-f]{64}", pod["metadata"]["annotations"]["checksum/config"])
            (c,) = pod["spec"]["containers"]
            assert c["args"] == ["--role", role]
            assert c["ports"][0]["containerPort"] == values["config"]["webPort"]
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
            assert c["envFrom"] == [{"configMapRef": {"name": "dmem"}}]
            assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            svc = services[f"dmem-{role}"]
            assert svc["spec"]["ports"][0]["targetPort"] == "http"
            assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


def test_config_checksum_follows_the_config() -> None:
    with helm.Chart.load(str(DEFAULT_CHART)) as c:
        a = yaml.safe_load_all(c.render(None, name="dmem")["dmem/templates/deployment.yaml"])
        b = yaml.safe_load_all(
            c.render({"config": {"logLevel": "debug"}}, name="dmem")[
                "dmem/templates/deployment.yaml"
            ]
        )
        sums = [
            [d["spec"]["template"]["metadata"]["annotations"]["checksum/config"] for d in docs if d]
            for docs in (a, b)
        ]
    assert sums[0] and len(set(sums[0])) == 1 and set(sums[0]).isdisjoint(sums[1])


def test_sasl_and_milvus_credentials_come_from_existing_secrets(chart: Any) -> None:
    _, rendered = chart
    docs = rendered["external-kafka-sasl-values.yaml"]
    assert not by_kind(docs, "Secret"), "existingSecret must not create a chart Secret"
    cm = by_kind(docs, "ConfigMap")["dmem"]["data"]
    assert cm["DMEM_KAFKA__SECURITY_PROTOCOL"] == "SASL_SSL"
    assert cm["DMEM_KAFKA__SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert cm["DMEM_KAFKA__BROKER"].count(";") == 2
    assert cm["DMEM_KAFKA__SSL_CAFILE"] == "/etc/dmem/kafka-ca/ca.crt"
    assert not any("PASSWORD" in k or "TOKEN" in k for k in cm), "secrets leaked into the ConfigMap"
    for dep in by_kind(docs, "Deployment").values():
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "valueFrom" in e}
        assert env["DMEM_KAFKA__SASL_USERNAME"] == {"name": "dmem-kafka-sasl", "key": "user"}
        assert env["DMEM_KAFKA__SASL_PASSWORD"] == {"name": "dmem-kafka-sasl", "key": "password"}
        assert env["DMEM_MILVUS__TOKEN"] == {"name": "dmem-milvus", "key": "token"}
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["kafka-ca"] == "/etc/dmem/kafka-ca"


def test_hpa_and_servicemonitor(chart: Any) -> None:
    _, rendered = chart
    docs = rendered["hpa-servicemonitor-values.yaml"]
    hpas = by_kind(docs, "HorizontalPodAutoscaler")
    assert sorted(hpas) == ["dmem-respond", "dmem-write"]
    deps = by_kind(docs, "Deployment")
    for name, hpa in hpas.items():
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": name,
        }
        assert "replicas" not in deps[name]["spec"], "HPA owns replicas"
    assert "replicas" in deps["dmem-jobs"]["spec"]
    (sm,) = by_kind(docs, "ServiceMonitor").values()
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["endpoints"][0]["port"] == "http"
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    # chart-managed Secret for the inline Milvus token, rolled by checksum/secret
    secret = by_kind(docs, "Secret")["dmem-credentials"]
    assert set(secret["data"]) == {"token"}
    for dep in deps.values():
        assert "checksum/secret" in dep["spec"]["template"]["metadata"]["annotations"]


def test_minimal_single_all_role(chart: Any) -> None:
    _, rendered = chart
    docs = rendered["minimal-all-values.yaml"]
    assert sorted(by_kind(docs, "Deployment")) == ["dmem-all"]
    assert by_kind(docs, "ConfigMap")["dmem"]["data"]["DMEM_ENCODER__NAME"] == "hash"
    assert not by_kind(docs, "PodDisruptionBudget")


def test_secure_defaults_tls_sasl_milvus_token_network_policy(chart: Any) -> None:
    _, rendered = chart
    docs = rendered["default"]
    (cm,) = by_kind(docs, "ConfigMap").values()
    assert cm["data"]["DMEM_KAFKA__SECURITY_PROTOCOL"] == "SASL_SSL"
    assert cm["data"]["DMEM_KAFKA__SASL_MECHANISM"] == "SCRAM-SHA-512"
    for name, dep in by_kind(docs, "Deployment").items():
        env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["DMEM_KAFKA__SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "dmem-kafka"
        assert env["DMEM_MILVUS__TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "dmem-milvus", name
    (np,) = by_kind(docs, "NetworkPolicy").values()
    assert np["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = np["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert rule["from"] == [{"podSelector": {}}]  # this namespace only
    assert np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "dmem"
    off = {"networkPolicy": {"enabled": False}}
    assert not by_kind(_render(off), "NetworkPolicy")


@pytest.mark.parametrize(
    "bad",
    [
        {"roles": {"write": {"replicas": -1}}},
        {"config": {"encoder": {"name": "bert"}}},
        # SASL without a mechanism (the default has one)
        {"externalKafka": {"securityProtocol": "SASL_SSL", "sasl": {"mechanism": ""}}},
        {"externalKafka": {"brokers": ["no-port"]}},
        {"config": {"extraEnv": {"NOT_DMEM": "x"}}},
        {"replicaCount": 3},  # typo / unknown key
    ],
)
def test_values_schema_rejects_bad_values(bad: dict[str, Any]) -> None:
    with helm.Chart.load(str(DEFAULT_CHART)) as c, pytest.raises(helm.HelmValuesError):
        c.render(bad, name="dmem")


def _leaves(d: Any, prefix: str = "") -> list[str]:
    if isinstance(d, dict) and d:
        out: list[str] = []
        for k, v in d.items():
            out.extend(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return [prefix]


def test_every_value_is_documented_with_param() -> None:
    text = (DEFAULT_CHART / "values.yaml").read_text()
    params = set(re.findall(r"^\s*## @param (\S+) \S", text, flags=re.M))
    values = yaml.safe_load(text)
    leaves = _leaves(values)
    undocumented = [
        leaf for leaf in leaves if not any(leaf == p or leaf.startswith(p + ".") for p in params)
    ]
    assert undocumented == []
    unknown = [
        p for p in params if not any(leaf == p or leaf.startswith(p + ".") for leaf in leaves)
    ]
    assert unknown == []
    schema = json.loads((DEFAULT_CHART / "values.schema.json").read_text())
    assert set(values) <= set(schema["properties"])


def _render(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    with helm.Chart.load(str(DEFAULT_CHART)) as c:
        out = c.render(values, name="dmem", namespace="dmem", is_install=True)
    return [
        d
        for k, text in sorted(out.items())
        if not k.endswith("NOTES.txt")
        for d in yaml.safe_load_all(text)
        if d
    ]


def _merged(values: dict[str, Any] | None) -> dict[str, Any]:
    with helm.Chart.load(str(DEFAULT_CHART)) as c:
        merged: dict[str, Any] = c.merge_values(values)
    return merged


def _pod(docs: list[dict[str, Any]], role: str) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = by_kind(docs, "Deployment")[f"dmem-{role}"]["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    return pod, c


def _env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env") or []}


def _tokens_file_source(pod: dict[str, Any], c: dict[str, Any]) -> tuple[str, str, bool]:
    """(secretName, key, readOnly) behind DMEM_AUTH__TOKENS_FILE, resolved by hand."""
    path = _env(c)["DMEM_AUTH__TOKENS_FILE"]
    (m,) = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    (v,) = [v for v in pod["spec"]["volumes"] if v["name"] == m["name"]]
    rel = path[len(m["mountPath"]) + 1 :]
    (item,) = [i for i in v["secret"]["items"] if i["path"] == rel]
    return v["secret"]["secretName"], item["key"], bool(m.get("readOnly"))


def test_auth_tokens_from_existing_secret_mounted_into_every_role(chart: Any) -> None:
    report, rendered = chart
    assert report.auth_errors == []
    docs = rendered["external-kafka-sasl-values.yaml"]
    pod, c = _pod(docs, "respond")
    assert _env(c)["DMEM_AUTH__TOKENS_FILE"] == AUTH_TOKENS_FILE
    assert _tokens_file_source(pod, c) == ("dmem-api-tokens", "tokens", True)
    assert "DMEM_AUTH__DISABLED" not in _env(c)
    assert "checksum/auth" not in pod["metadata"]["annotations"]  # the chart cannot see it
    for role in ("write", "jobs"):  # Kafka record keys come from the same map
        wpod, wc = _pod(docs, role)
        assert _env(wc)["DMEM_AUTH__TOKENS_FILE"] == AUTH_TOKENS_FILE
        assert _tokens_file_source(wpod, wc) == ("dmem-api-tokens", "tokens", True)
        assert "DMEM_AUTH__DISABLED" not in _env(wc)


def test_auth_inline_tokens_in_chart_secret_never_in_configmap(chart: Any) -> None:
    _, rendered = chart
    docs = rendered["hpa-servicemonitor-values.yaml"]
    tokens = values_for("hpa-servicemonitor-values.yaml")["auth"]["tokens"]
    assert tokens
    secret = by_kind(docs, "Secret")["dmem-auth"]
    assert json.loads(base64.b64decode(secret["data"]["tokens.json"])) == tokens
    pod, c = _pod(docs, "respond")
    assert _tokens_file_source(pod, c) == ("dmem-auth", "tokens.json", True)
    assert re.fullmatch(r"[0-9a-f]{64}", pod["metadata"]["annotations"]["checksum/auth"])
    wpod, _ = _pod(docs, "write")  # every role rolls with the tokens
    assert (
        wpod["metadata"]["annotations"]["checksum/auth"]
        == pod["metadata"]["annotations"]["checksum/auth"]
    )
    text = yaml.safe_dump([d for d in docs if d["kind"] != "Secret"])
    assert not [t for t in tokens if t in text], "a token left its Secret"


def test_auth_checksum_follows_the_tokens() -> None:
    def checksum(tokens: dict[str, list[str]]) -> str:
        pod, _ = _pod(_render({"auth": {"tokens": tokens}}), "respond")
        return str(pod["metadata"]["annotations"]["checksum/auth"])

    a, b = checksum({"tok-a": ["acme"]}), checksum({"tok-a": ["acme", "beta"]})
    assert a != b and a == checksum({"tok-a": ["acme"]})


def test_auth_disabled_and_fail_closed_defaults(chart: Any) -> None:
    _, rendered = chart
    # minimal-all: auth.enabled=false on the all role (it serves /v1)
    _, c = _pod(rendered["minimal-all-values.yaml"], "all")
    assert _env(c)["DMEM_AUTH__DISABLED"] == "true"
    assert "DMEM_AUTH__TOKENS_FILE" not in _env(c)
    # default values: enabled, nothing configured -> no mount, auth stays on (401)
    docs = rendered["default"]
    pod, c = _pod(docs, "respond")
    assert not [k for k in _env(c) if k.startswith("DMEM_AUTH__")]
    assert "auth-tokens" not in {v["name"] for v in pod["spec"]["volumes"]}
    assert "Secret" not in {d["kind"] for d in docs}
    with helm.Chart.load(str(DEFAULT_CHART)) as ch:
        notes = ch.render(None, name="dmem")["dmem/templates/NOTES.txt"]
    assert "answered 401" in notes and "auth.existingSecret" in notes


def test_auth_all_role_with_tokens_renders_and_validates() -> None:
    values = {
        "roles": {r: {"enabled": r == "all"} for r in ROLES},
        "auth": {"tokens": {"all-role-token": ["*"]}},
    }
    docs = _render(values)
    pod, c = _pod(docs, "all")
    assert _tokens_file_source(pod, c) == ("dmem-auth", "tokens.json", True)
    assert check_chart_auth(_merged(values), docs, "all") == []


@pytest.mark.parametrize(
    "bad",
    [
        {"auth": {"existingSecret": "s", "tokens": {"t": ["*"]}}},  # both: ambiguous
        {"auth": {"tokens": {"has space": ["*"]}}},
        {"auth": {"tokens": {"tok": []}}},
        {"auth": {"enabled": "yes"}},
    ],
)
def test_values_schema_rejects_bad_auth(bad: dict[str, Any]) -> None:
    with helm.Chart.load(str(DEFAULT_CHART)) as c, pytest.raises(helm.HelmValuesError):
        c.render(bad, name="dmem")


def test_auth_checks_catch_breakage() -> None:
    values = {"auth": {"tokens": {"secret-token-xyz": ["acme"]}}}
    merged = _merged(values)

    def broken(edit: Any) -> str:
        docs = _render(values)
        assert check_chart_auth(merged, docs, "t") == []
        edit(docs)
        return "\n".join(check_chart_auth(merged, docs, "t"))

    def respond(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
        return _pod(docs, "respond")

    def drop_env(docs: list[dict[str, Any]]) -> None:
        _, c = respond(docs)
        c["env"] = [e for e in c["env"] if e["name"] != "DMEM_AUTH__TOKENS_FILE"]

    def wrong_key(docs: list[dict[str, Any]]) -> None:
        pod, _ = respond(docs)
        (v,) = [v for v in pod["spec"]["volumes"] if v["name"] == "auth-tokens"]
        v["secret"]["items"][0]["key"] = "other"

    def writable(docs: list[dict[str, Any]]) -> None:
        _, c = respond(docs)
        for m in c["volumeMounts"]:
            m.pop("readOnly", None)

    def not_secret(docs: list[dict[str, Any]]) -> None:
        pod, _ = respond(docs)
        for v in pod["spec"]["volumes"]:
            if v["name"] == "auth-tokens":
                v.pop("secret")
                v["configMap"] = {"name": "dmem"}

    def leak(docs: list[dict[str, Any]]) -> None:
        by_kind(docs, "ConfigMap")["dmem"]["data"]["DMEM_EXTRA"] = "secret-token-xyz"

    def inline(docs: list[dict[str, Any]]) -> None:
        _, c = respond(docs)
        c["env"].append({"name": "DMEM_AUTH__TOKENS", "value": '{"x": ["*"]}'})

    def off_write(docs: list[dict[str, Any]]) -> None:
        _, c = _pod(docs, "write")
        c["env"] = [e for e in c["env"] if e["name"] != "DMEM_AUTH__TOKENS_FILE"]

    def no_checksum(docs: list[dict[str, Any]]) -> None:
        pod, _ = respond(docs)
        del pod["metadata"]["annotations"]["checksum/auth"]

    for edit, expect in [
        (drop_env, "no DMEM_AUTH__TOKENS_FILE"),
        (wrong_key, "expected 'tokens.json'"),
        (writable, "not readOnly"),
        (not_secret, "not a Secret volume"),
        (leak, "holds an HTTP API token"),
        (inline, "DMEM_AUTH__TOKENS in the pod spec"),
        (off_write, "no DMEM_AUTH__TOKENS_FILE"),
        (no_checksum, "checksum/auth"),
    ]:
        assert expect in broken(edit), edit.__name__
    # disabled: the respond pod must say so
    off = {"auth": {"enabled": False}}
    docs = _render(off)
    assert check_chart_auth(_merged(off), docs, "off") == []
    _, c = _pod(docs, "respond")
    c["env"] = [e for e in c["env"] if e["name"] != "DMEM_AUTH__DISABLED"]
    assert "DMEM_AUTH__DISABLED is not true" in "\n".join(
        check_chart_auth(_merged(off), docs, "off")
    )


def test_compose_validates_and_wires_services() -> None:
    report = Report()
    data = check_compose(DEFAULT_COMPOSE, DEFAULT_COMPOSE_SCHEMA, report)
    assert report.compose_errors == []
    assert report.compose_valid
    s = data["services"]
    assert {"kafka", "milvus", "etcd", "minio", "write", "respond", "jobs"} <= set(s)
    assert s["kafka"]["image"].startswith("apache/kafka:")
    assert "broker,controller" in s["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]
    assert s["milvus"]["image"].startswith("milvusdb/milvus:v2.4.")
    assert s["milvus"]["command"] == ["milvus", "run", "standalone"]
    assert s["milvus"]["environment"]["ETCD_ENDPOINTS"] == "etcd:2379"
    assert s["milvus"]["environment"]["MINIO_ADDRESS"] == "minio:9000"
    assert "127.0.0.1:19530:19530" in s["milvus"]["ports"]
    assert s["topics"]["entrypoint"] == ["dmem", "topics", "create"]
    for role in ("write", "respond", "jobs"):
        svc = s[role]
        env = svc["environment"]
        assert svc["command"] == ["--role", role]
        assert env["DMEM_KAFKA__BROKER"] == "kafka://kafka:9092"
        assert env["DMEM_MILVUS__URI"] == "http://milvus:19530"
        assert env["DMEM_WEB_HOST"] == "0.0.0.0"
        assert svc["depends_on"]["kafka"]["condition"] == "service_healthy"
        assert svc["depends_on"]["milvus"]["condition"] == "service_healthy"
        assert svc["depends_on"]["topics"]["condition"] == "service_completed_successfully"
        assert any(p.startswith("127.0.0.1:") and p.endswith(":6066") for p in svc["ports"])
        assert "/health" in " ".join(svc["healthcheck"]["test"])
    # every role has the token map (respond checks /v1, all sign Kafka records with it):
    # from $DMEM_API_TOKEN, required, no default
    raw = s["respond"]["environment"]["DMEM_AUTH__TOKENS"]
    assert "${DMEM_API_TOKEN:?" in raw and ":-" not in raw
    assert json.loads(_env_map(s["respond"]["environment"])["DMEM_AUTH__TOKENS"]) == {
        "<DMEM_API_TOKEN>": ["*"]
    }
    # nothing is published on every interface
    published = [p for svc in s.values() for p in svc.get("ports") or []]
    assert published and all(str(p).startswith("127.0.0.1:") for p in published)
    assert all(s[r]["environment"]["DMEM_AUTH__TOKENS"] == raw for r in ("write", "jobs"))


def test_compose_checks_catch_breakage(tmp_path: Path) -> None:
    data = yaml.safe_load(DEFAULT_COMPOSE.read_text())
    data["services"]["write"]["environment"] = {
        **data["services"]["write"]["environment"],
        "DMEM_KAFKA__BROKER": "kafka://localhost:9092",
        "DMEM_NOT_A_SETTING": "1",
    }
    data["services"]["respond"]["restart_policy"] = "always"  # not in the Compose schema
    del data["services"]["etcd"]
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(yaml.safe_dump(data))
    report = Report()
    check_compose(bad, DEFAULT_COMPOSE_SCHEMA, report)
    assert not report.compose_valid
    text = "\n".join(report.compose_errors)
    assert "'etcd' is missing" in text and "restart_policy" in text
    # wiring alone (schema-valid file)
    data = yaml.safe_load(DEFAULT_COMPOSE.read_text())
    data["services"]["jobs"]["environment"] = {
        **data["services"]["jobs"]["environment"],
        "DMEM_MILVUS__URI": "http://localhost:19530",
        "DMEM_NOT_A_SETTING": "1",
    }
    bad.write_text(yaml.safe_dump(data))
    report = Report()
    check_compose(bad, DEFAULT_COMPOSE_SCHEMA, report)
    text = "\n".join(report.compose_errors)
    assert "jobs: DMEM_MILVUS__URI" in text and "DMEM_NOT_A_SETTING is not a dmem setting" in text
    # auth of the /v1 service
    for tokens, expect in [
        (None, "sets no DMEM_AUTH__TOKENS"),
        ('{"${DMEM_API_TOKEN:-x}": "*"}', "non-empty {token: [tenants]}"),
        ("{${DMEM_API_TOKEN:-x}: [*]}", "not JSON"),
        ('{"hard-coded": ["*"]}', "written into the file"),
        ('{"${DMEM_API_TOKEN:-change-me}": ["*"]}', "has a default token"),
    ]:
        data = yaml.safe_load(DEFAULT_COMPOSE.read_text())
        env = data["services"]["respond"]["environment"]
        env.pop("DMEM_AUTH__TOKENS")
        if tokens is not None:
            env["DMEM_AUTH__TOKENS"] = tokens
        bad.write_text(yaml.safe_dump(data))
        report = Report()
        check_compose(bad, DEFAULT_COMPOSE_SCHEMA, report)
        assert expect in "\n".join(report.compose_errors), tokens
    # a port published on every interface
    for port in ("9094:9094", "0.0.0.0:9094:9094", {"target": 9094, "published": 9094}):
        data = yaml.safe_load(DEFAULT_COMPOSE.read_text())
        data["services"]["kafka"]["ports"] = [port]
        bad.write_text(yaml.safe_dump(data))
        report = Report()
        check_compose(bad, DEFAULT_COMPOSE_SCHEMA, report)
        assert "kafka: port" in "\n".join(report.compose_errors), port


def test_dockerfile_basics() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim|^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.M)
    assert "download.pytorch.org/whl/cpu" in text
    assert re.search(r"^USER 10001", text, re.M)
    assert 'ENTRYPOINT ["dmem", "worker"]' in text
    assert 'CMD ["--role", "all"]' in text
    assert re.search(r"^HEALTHCHECK .*\n.*/health", text, re.M)
    assert "DMEM_WEB_HOST=0.0.0.0" in text
    assert "build_encoder('minilm')" in text  # the model is loaded at build time
    ignore = (REPO_ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignore and ".git" in ignore


def test_deploycheck_cli_contract() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dmem.cli", "deploycheck", "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in (
        "chart_renders",
        "manifests_valid",
        "manifests_invalid",
        "lint_errors",
        "auth_errors",
        "compose_valid",
        "compose_services",
    ):
        assert key in out
    assert out["ok"] is True
    assert out["chart_renders"] == 1 + len(CI_FILES)
    assert out["manifests_invalid"] == 0 and out["manifests_valid"] > 0
    assert out["lint_errors"] == 0
    assert out["auth_errors"] == []
    assert out["compose_valid"] is True
    assert {"kafka", "milvus", "etcd", "minio", "write", "respond", "jobs"} <= set(
        out["compose_services"]
    )


def test_notes_restart_every_deployment_that_reads_the_tokens_secret() -> None:
    """After a change to ``auth.existingSecret`` the notes say how to restart: the
    selector of their ``rollout restart`` must match every Deployment the release
    renders (each role reads the tokens at start) and nothing of another release."""
    values = {"auth": {"existingSecret": "dmem-api-tokens"},
              "roles": {r: {"enabled": r != "all"} for r in ROLES}}  # fmt: skip
    with helm.Chart.load(str(DEFAULT_CHART)) as c:
        out = c.render(values, name="rel-a", namespace="ns", is_install=True)
    notes = out["dmem/templates/NOTES.txt"]
    (line,) = [ln for ln in notes.splitlines() if "rollout restart" in ln]
    m = re.search(r"-n (\S+) rollout restart deployment -l (\S+)=(\S+)$", line.strip())
    assert m is not None, line
    ns, key, value = m.groups()
    docs = [d for k, text in out.items() if not k.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]  # fmt: skip
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert ns == "ns" and len(deployments) == len(ROLES) - 1
    for d in deployments:
        assert d["metadata"]["labels"].get(key) == value == "rel-a", d["metadata"]["name"]
        reads = json.dumps(d["spec"]["template"]["spec"])
        assert "dmem-api-tokens" in reads, d["metadata"]["name"]
