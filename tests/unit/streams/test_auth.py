"""Bearer-token checks (`streams.auth`) and their settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.errors import ConfigError
from streams.auth import Authorizer, load_tokens
from streams.settings import Settings


def test_tokens_from_env_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DMEM_AUTH__TOKENS", json.dumps({"t1": ["acme"], "ops": ["*"]}))
    a = Authorizer.from_settings(Settings())
    assert not a.disabled
    assert a.check("Bearer t1", "acme") is None
    assert a.check("bearer t1", "acme") is None
    d = a.check("Bearer t1", "globex")
    assert d is not None and d.status == 403
    assert a.check("Bearer ops", "globex") is None
    for bad in (None, "", "Bearer", "Bearer ", "Basic t1", "Bearer t2", "Bearer t1x", "t1"):
        d = a.check(bad, "acme")
        assert d is not None and d.status == 401, bad
    assert a.check("Bearer t1") is None  # authenticate only


def test_a_token_that_is_not_utf8_is_unknown() -> None:
    """aiohttp hands a non-UTF-8 header byte over as a lone surrogate: 401, not a
    UnicodeEncodeError (500)."""
    a = Authorizer(False, load_tokens({"t\u00f6k": ["acme"]}, None))
    for bad in ("Bearer t\udcf6k", "Bearer \udcff"):
        d = a.check(bad, "acme")
        assert d is not None and d.status == 401
        assert a.scope(bad) == frozenset()
    assert a.check("Bearer t\u00f6k", "acme") is None


def test_default_is_fail_closed_and_disable_is_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DMEM_AUTH__TOKENS", raising=False)
    monkeypatch.delenv("DMEM_AUTH__DISABLED", raising=False)
    a = Authorizer.from_settings(Settings())
    d = a.check("Bearer anything", "acme")
    assert d is not None and d.status == 401
    monkeypatch.setenv("DMEM_AUTH__DISABLED", "true")
    assert Authorizer.from_settings(Settings()).check(None, "acme") is None


def test_tokens_file_merges_and_validates(tmp_path: Path) -> None:
    f = tmp_path / "tokens.json"
    f.write_text(json.dumps({"t1": ["b"], "t3": ["c"]}))
    toks = load_tokens({"t1": ["a"]}, f)
    assert toks == {"t1": frozenset({"a", "b"}), "t3": frozenset({"c"})}
    f.write_text(json.dumps({"t1": "a"}))
    with pytest.raises(ConfigError):
        load_tokens({}, f)
    with pytest.raises(ConfigError):
        load_tokens({}, tmp_path / "missing.json")
    with pytest.raises(ConfigError):
        load_tokens({"": ["a"]}, None)


def test_local_stack_disables_auth_unless_configured(tmp_path: Path) -> None:
    from streams.local.stack import LocalStack

    assert LocalStack(tmp_path).env(1)["DMEM_AUTH__DISABLED"] == "true"
    env = LocalStack(tmp_path, extra_env={"DMEM_AUTH__TOKENS": "{}"}).env(1)
    assert "DMEM_AUTH__DISABLED" not in env
