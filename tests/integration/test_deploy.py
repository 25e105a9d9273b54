"""Deployment files: the Helm chart rendered and linted by the real Helm engine
(helm-python-sdk, Helm's Go SDK), manifests validated against the Kubernetes
schemas (kubernetes-validate), docker-compose.yml against the Compose schema,
and the `dmem deploycheck --json` contract. No cluster and no Docker needed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams.deploy import (
    DEFAULT_CHART,
    DEFAULT_COMPOSE,
    DEFAULT_COMPOSE_SCHEMA,
    DEFAULT_KUBE_VERSIONS,
    REPO_ROOT,
    Report,
    check_chart,
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
        env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]}
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
    (secret,) = by_kind(docs, "Secret").values()
    assert set(secret["data"]) == {"token"}
    for dep in deps.values():
        assert "checksum/secret" in dep["spec"]["template"]["metadata"]["annotations"]


def test_minimal_single_all_role(chart: Any) -> None:
    _, rendered = chart
    docs = rendered["minimal-all-values.yaml"]
    assert sorted(by_kind(docs, "Deployment")) == ["dmem-all"]
    assert by_kind(docs, "ConfigMap")["dmem"]["data"]["DMEM_ENCODER__NAME"] == "hash"
    assert not by_kind(docs, "PodDisruptionBudget")


@pytest.mark.parametrize(
    "bad",
    [
        {"roles": {"write": {"replicas": -1}}},
        {"config": {"encoder": {"name": "bert"}}},
        {"externalKafka": {"securityProtocol": "SASL_SSL"}},  # SASL without a mechanism
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
    assert "19530:19530" in s["milvus"]["ports"]
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
        assert any(p.endswith(":6066") for p in svc["ports"])
        assert "/health" in " ".join(svc["healthcheck"]["test"])


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
        [sys.executable, "-m", "streams.cli", "deploycheck", "--json"],
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
        "compose_valid",
        "compose_services",
    ):
        assert key in out
    assert out["ok"] is True
    assert out["chart_renders"] == 1 + len(CI_FILES)
    assert out["manifests_invalid"] == 0 and out["manifests_valid"] > 0
    assert out["lint_errors"] == 0
    assert out["compose_valid"] is True
    assert {"kafka", "milvus", "etcd", "minio", "write", "respond", "jobs"} <= set(
        out["compose_services"]
    )
