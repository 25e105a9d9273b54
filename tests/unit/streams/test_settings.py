"""Settings: env parsing, validation, and security pass-through to Kafka clients."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from streams.admin import kafka_client_kwargs
from streams.settings import Settings


def test_env_nesting_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DMEM_GATE__Q_HIGH", "0.95")
    monkeypatch.setenv("DMEM_KAFKA__BROKER", "10.0.0.5:9093")
    s = Settings()
    assert s.gate.q_high == 0.95
    assert s.kafka.broker == "kafka://10.0.0.5:9093" and s.kafka.bootstrap == "10.0.0.5:9093"
    assert s.milvus_uri.endswith("milvus.db")  # empty URI: the embedded Lite default
    assert s.topic("transitions") == "dmem.transitions"


def test_invalid_settings_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DMEM_GATE__Q_LOW", "0.95")  # above q_high
    with pytest.raises(ValidationError, match="q_low"):
        Settings()


def test_sasl_and_tls_reach_aiokafka_and_faust(monkeypatch: pytest.MonkeyPatch) -> None:
    from streams.app import faust_credentials

    monkeypatch.setenv("DMEM_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("DMEM_KAFKA__SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("DMEM_KAFKA__SASL_USERNAME", "svc")
    monkeypatch.setenv("DMEM_KAFKA__SASL_PASSWORD", "pw")
    s = Settings()
    kw = kafka_client_kwargs(s.kafka)
    assert kw["security_protocol"] == "SASL_SSL"
    assert kw["sasl_mechanism"] == "SCRAM-SHA-512" and kw["sasl_plain_username"] == "svc"
    assert kw["ssl_context"] is not None
    creds = faust_credentials(s)
    assert creds is not None and creds.username == "svc" and creds.ssl_context is not None
    for var in ("SECURITY_PROTOCOL", "SASL_MECHANISM", "SASL_USERNAME", "SASL_PASSWORD"):
        monkeypatch.delenv(f"DMEM_KAFKA__{var}")
    assert faust_credentials(Settings()) is None


@pytest.mark.parametrize(("env", "where"), [
    ('{"s3cr3t-token": "t1"}', "bad setting auth.tokens:"),  # the token is a dict key
    ('{"s3cr3t-token": ["t1"]', "bad setting:"),  # not JSON
    ('["s3cr3t-token"]', "bad setting auth.tokens:"),
])  # fmt: skip
def test_a_malformed_token_map_never_prints_the_token(
    monkeypatch: pytest.MonkeyPatch, env: str, where: str
) -> None:
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from streams.settings import setting_error

    monkeypatch.setenv("DMEM_AUTH__TOKENS", env)
    with pytest.raises((ValidationError, SettingsError)) as e:
        Settings()
    line = setting_error(e.value)
    assert line.startswith(where) and "s3cr3t" not in line


def test_the_credit_fit_margin_reaches_the_ranking(monkeypatch: pytest.MonkeyPatch) -> None:
    from streams.respond.http import policy_from

    monkeypatch.setenv("DMEM_RESPOND__CREDIT_FIT_MARGIN", "0.3")
    assert policy_from(Settings()).fit_margin == 0.3
    monkeypatch.setenv("DMEM_RESPOND__CREDIT_FIT_MARGIN", "-0.1")
    with pytest.raises(ValidationError):
        Settings()


def test_the_ranking_recency_follows_the_span_factor_of_the_horizons(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from streams.respond.http import policy_from

    assert policy_from(Settings()).span_factor == Settings().maintenance.span_factor == 1.0
    monkeypatch.setenv("DMEM_MAINTENANCE__SPAN_FACTOR", "0")
    assert policy_from(Settings()).span_factor == 0.0


def test_the_context_guard_follows_the_encoder_unless_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unset, the second look and the posterior cut are the encoder's calibration
    (`GUARD_BY_ENCODER`); an explicit setting wins over it, either way."""
    from streams.write.pipeline import intrinsic_config

    def guard(encoder: str, **env: str) -> tuple[bool, float]:
        for k in ("RECHECK_COLD", "OFF_POSTERIOR"):
            monkeypatch.delenv(f"DMEM_INTRINSIC__{k}", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(f"DMEM_INTRINSIC__{k.upper()}", v)
        monkeypatch.setenv("DMEM_ENCODER__NAME", encoder)
        cfg = intrinsic_config(Settings())
        return cfg.recheck_cold, cfg.off_posterior

    assert guard("minilm") == (True, 0.75)
    for name in ("minilm-static", "hash", "passthrough"):
        assert guard(name) == (False, 0.9)
    assert guard("minilm", recheck_cold="false") == (False, 0.75)
    assert guard("minilm", off_posterior="0.9") == (True, 0.9)
    assert guard("minilm-static", recheck_cold="true", off_posterior="0.6") == (True, 0.6)
    monkeypatch.setenv("DMEM_INTRINSIC__OFF_POSTERIOR", "0")
    with pytest.raises(ValidationError):
        Settings()


def test_machine_speakers_reach_the_write_path_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The LLM roles by default; a JSON list replaces them, [] weighs every speaker's
    first person."""
    from schemas import MACHINE_SPEAKERS
    from streams.write.pipeline import intrinsic_config

    monkeypatch.delenv("DMEM_INTRINSIC__MACHINE_SPEAKERS", raising=False)
    assert intrinsic_config(Settings()).machine_speakers == MACHINE_SPEAKERS
    assert "assistant" in MACHINE_SPEAKERS
    monkeypatch.setenv("DMEM_INTRINSIC__MACHINE_SPEAKERS", '["Copilot"]')
    assert intrinsic_config(Settings()).machine_speakers == ("copilot",)
    monkeypatch.setenv("DMEM_INTRINSIC__MACHINE_SPEAKERS", "[]")
    assert intrinsic_config(Settings()).machine_speakers == ()
    monkeypatch.setenv("DMEM_INTRINSIC__MACHINE_SPEAKERS", '["assistant", " "]')
    with pytest.raises(ValidationError, match="machine_speakers"):
        Settings()
