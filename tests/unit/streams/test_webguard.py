"""The web server's request guards (`streams.webguard`): Host, Origin, Content-Type."""

from __future__ import annotations

import pytest

from streams.settings import Settings
from streams.webguard import Guard, host_name

JSON = {"Content-Type": "application/json"}


def local(**headers: str) -> tuple[int, str] | None:
    return Guard("127.0.0.1", [], []).refusal("POST", {"Host": "127.0.0.1:6066", **JSON,
                                                      **headers})  # fmt: skip


@pytest.mark.parametrize(("value", "name"), [
    ("127.0.0.1:6066", "127.0.0.1"), ("LOCALHOST", "localhost"), ("[::1]:80", "::1"),
    ("::1", "::1"), ("evil.example:6066", "evil.example"), ("", ""),
])  # fmt: skip
def test_host_name(value: str, name: str) -> None:
    assert host_name(value) == name


def test_loopback_bind_answers_loopback_names_only() -> None:
    g = Guard("127.0.0.1", [], [])
    for host in ("127.0.0.1:6066", "localhost:6066", "[::1]:6066", "localhost"):
        assert g.refusal("GET", {"Host": host}) is None, host
    for host in ("rebind.attacker.example:6066", "10.0.0.5:6066", ""):
        no = g.refusal("GET", {"Host": host})
        assert no is not None and no[0] == 421 and "web_allowed_hosts" in no[1], host


def test_other_bind_answers_any_host_unless_listed() -> None:
    assert Guard("0.0.0.0", [], []).refusal("GET", {"Host": "dmem.svc:6066"}) is None
    g = Guard("0.0.0.0", ["dmem.svc"], [])
    assert g.refusal("GET", {"Host": "dmem.svc:6066"}) is None
    no = g.refusal("GET", {"Host": "other:6066"})
    assert no is not None and no[0] == 421
    assert Guard("127.0.0.1", ["*"], []).refusal("GET", {"Host": "any.example"}) is None


def test_cross_site_origin_refused_own_origin_allowed() -> None:
    assert local(Origin="http://127.0.0.1:6066") is None  # the live page itself
    assert local(Origin="http://localhost:6066") is None
    for origin in ("https://evil.example", "null", "http://127.0.0.1.evil.example"):
        no = local(Origin=origin)
        assert no is not None and no[0] == 403 and "origin" in no[1], origin
    g = Guard("127.0.0.1", [], ["https://app.example.com/"])
    ok = {"Host": "localhost", "Origin": "https://app.example.com", **JSON}
    assert g.refusal("POST", ok) is None
    # a deployment that answers any host and lists no origins leaves Origin to CORS
    assert Guard("0.0.0.0", [], []).refusal("POST", {"Origin": "https://x.example", **JSON}) is None
    # listing origins turns the check on there too
    no = Guard("0.0.0.0", [], ["https://app.example.com"]).refusal(
        "POST", {"Origin": "https://x.example", **JSON}
    )
    assert no is not None and no[0] == 403


@pytest.mark.parametrize("ctype", [
    "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "",
])  # fmt: skip
def test_state_changing_bodies_must_be_json(ctype: str) -> None:
    g = Guard("0.0.0.0", [], [])
    for method in ("POST", "PUT", "PATCH"):
        no = g.refusal(method, {"Content-Type": ctype} if ctype else {})
        assert no is not None and no[0] == 415 and "application/json" in no[1]


def test_json_and_ndjson_pass_reads_need_no_type() -> None:
    g = Guard("0.0.0.0", [], [])
    for ctype in ("application/json", "application/json; charset=utf-8", "application/x-ndjson",
                  "Application/JSON"):  # fmt: skip
        assert g.refusal("POST", {"Content-Type": ctype}) is None, ctype
    for method in ("GET", "HEAD", "DELETE", "OPTIONS"):
        assert g.refusal(method, {}) is None


def test_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DMEM_WEB_ALLOWED_HOSTS", '["dmem.local"]')
    g = Guard.from_settings(Settings())
    assert g.hosts == frozenset({"dmem.local"})
    assert g.refusal("GET", {"Host": "localhost"}) is not None
