"""The services' backend selection (DMEM_TEST_BACKEND) and the container settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from dmem_bench.backends import (
    COMPOSE_FILE,
    bench_services,
    compose_images,
    docker_engine,
    kafka_env,
    kafka_start_script,
    select_backend,
)
from schemas.errors import ConfigError


def engine_up() -> tuple[bool, str]:
    return True, "Docker engine 27.1"


def engine_down() -> tuple[bool, str]:
    return False, "no Docker engine answers (connection refused)"


def never_probe() -> tuple[bool, str]:
    raise AssertionError("embedded must not probe Docker")


@pytest.mark.parametrize("requested", [None, "", "embedded", " Embedded "])
def test_embedded_is_the_default_and_never_probes(requested: str | None) -> None:
    choice = select_backend(requested, never_probe)
    assert (choice.name, choice.available, choice.skip_reason) == ("embedded", True, None)


def test_auto_uses_containers_when_an_engine_answers() -> None:
    choice = select_backend("auto", engine_up)
    assert (choice.name, choice.available) == ("containers", True)
    assert "27.1" in choice.reason


def test_auto_falls_back_to_embedded_and_names_the_missing_engine() -> None:
    choice = select_backend("auto", engine_down)
    assert (choice.name, choice.available, choice.skip_reason) == ("embedded", True, None)
    assert "fell back" in choice.reason and "connection refused" in choice.reason


def test_forced_containers_without_engine_is_unavailable_not_a_fallback() -> None:
    choice = select_backend("containers", engine_down)
    assert (choice.name, choice.available) == ("containers", False)
    assert choice.skip_reason is not None and "connection refused" in choice.skip_reason


def test_forced_containers_with_engine() -> None:
    choice = select_backend("CONTAINERS", engine_up)
    assert (choice.name, choice.available, choice.skip_reason) == ("containers", True, None)


def test_unknown_backend_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="embedded, containers, auto"):
        select_backend("docker", engine_up)


def test_real_probe_reports_an_absent_engine(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:  # fmt: skip
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    ok, why = docker_engine(timeout_s=1)
    assert not ok and "no Docker engine" in why


def test_images_come_from_the_compose_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yml"
    f.write_text("services:\n  kafka: {image: 'apache/kafka:9.9'}\n"
                 "  milvus: {image: 'milvusdb/milvus:v9'}\n")  # fmt: skip
    assert compose_images(f) == {"kafka": "apache/kafka:9.9", "milvus": "milvusdb/milvus:v9"}
    f.write_text("services:\n  kafka: {image: 'apache/kafka:9.9'}\n")
    with pytest.raises(ConfigError, match="services.milvus.image"):
        compose_images(f)


def test_repo_compose_file_runs_apache_kafka_and_milvus_standalone() -> None:
    images = compose_images(COMPOSE_FILE)
    assert images["kafka"].startswith("apache/kafka:")
    assert images["milvus"].startswith("milvusdb/milvus:")


def test_kafka_advertises_the_mapped_host_port() -> None:
    env = kafka_env("10.0.0.5", 32811)
    assert "EXTERNAL://10.0.0.5:32811" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    script = kafka_start_script(env).decode()
    assert "export KAFKA_ADVERTISED_LISTENERS='PLAINTEXT://localhost:9092," in script
    assert script.rstrip().endswith("exec /etc/kafka/docker/run")


def test_bench_backend_embedded_leaves_the_services_to_the_bench() -> None:
    with bench_services("embedded") as (bootstrap, uri):
        assert (bootstrap, uri) == (None, None)


def test_bench_backend_containers_without_engine_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    with pytest.raises(ConfigError, match="--backend containers: no Docker engine"):
        with bench_services("containers"):
            raise AssertionError("must not yield")
