"""Commands that sign for the service (`dmem forget`, `dmem import`) against a `dmem up`
that checks record credentials: they refuse to act when their key is not the stack's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dmem.cli.common import UsageError, check_signing
from streams.auth import service_key_id
from streams.local.announce import announce_stack
from streams.settings import Settings

TOKENS = {"tok-a": ["acme"], "tok-ops": ["*"]}


def settings(**auth: object) -> Settings:
    return Settings(auth=auth)  # type: ignore[arg-type]


def test_the_key_id_tells_whether_two_settings_sign_alike() -> None:
    a = service_key_id(settings(tokens=TOKENS))
    assert a is not None and a == service_key_id(settings(tokens=dict(TOKENS)))
    assert a != service_key_id(settings(tokens={"tok-a": ["acme"]}))
    assert service_key_id(settings(disabled=True, tokens=TOKENS)) is None  # Kafka auth off
    assert service_key_id(settings()) is None  # no tokens: off
    s1 = service_key_id(settings(tokens=TOKENS, service_secret="s3cret"))
    assert s1 == service_key_id(settings(tokens={"other": ["x"]}, service_secret="s3cret"))
    assert s1 != a and len(s1) == 16 and "s3cret" not in s1


def test_a_stack_that_checks_credentials_refuses_a_shell_that_would_not_sign_alike() -> None:
    up = {"pid": 4242, "service_key_id": service_key_id(settings(tokens=TOKENS))}
    check_signing(settings(tokens=TOKENS), up, "forget")  # the stack's own settings: fine
    with pytest.raises(UsageError, match=r"4242.*sign no records.*DELETE /v1/memories"):
        check_signing(settings(), up, "forget")
    with pytest.raises(UsageError, match=r"another key.*DMEM_API_TOKEN"):
        check_signing(settings(tokens={"tok-a": ["acme"]}), up, "import")
    check_signing(settings(), {"pid": 1, "service_key_id": None}, "forget")  # auth off
    check_signing(settings(), None, "import")  # no stack found: the deployment's settings


def test_dmem_up_announces_its_key_id_and_never_its_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k in list(os.environ):
        if k.startswith("DMEM_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("DMEM_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("DMEM_DATA_DIR", str(tmp_path / "data"))
    s = settings(tokens=TOKENS, service_secret="s3cret")
    paths = announce_stack(s, {"kafka": "127.0.0.1:1", "http": "http://127.0.0.1:2",
                               "data_dir": str(tmp_path / "data"), "pid": os.getpid()})  # fmt: skip
    for p in paths:
        text = p.read_text()
        assert json.loads(text)["service_key_id"] == service_key_id(s)
        assert "s3cret" not in text and "tok-a" not in text
