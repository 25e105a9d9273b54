"""Bad input to the SDK is a `DmemError` (`InvalidRecord`, not retriable) naming the
field, and nothing is sent: no pydantic error escapes, no bad value is mended quietly."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dmem import DmemError
from dmem.client import ChatTurn, Client
from schemas import Transition
from schemas.errors import InvalidRecord
from tests.unit.dmem.test_client_credentials import FakeProducer

Call = Callable[[Client], Awaitable[Any]]

BAD: dict[str, tuple[Call, str]] = {
    "nan outcome": (lambda c: c.report_outcome("e", float("nan")), "reward"),
    "negative step": (lambda c: c.report_usage("e", "r", {"m": 1.0}, step=-1), "step"),
    "negative weight": (lambda c: c.report_usage("e", "r", {"m": -1.0, "n": 2.0}), "'m': -1.0"),
    "nan weight": (lambda c: c.report_usage("e", "r", {"m": float("nan")}), "'m': nan"),
    "infinite weight": (lambda c: c.report_usage("e", "r", {"m": float("inf")}), "'m': inf"),
    "text weight": (lambda c: c.report_usage("e", "r", {"m": "x"}), "'m': 'x'"),
    "no weight": (lambda c: c.report_usage("e", "r", {"m": None}), "'m': None"),
    "unknown thumbs": (lambda c: c.feedback(memory_id="m", kind="like"), "kind"),
    "k of 0": (lambda c: c.search("where?", k=0), "k"),
    "unknown filter": (lambda c: c.search("where?", colour="red"), "colour"),
    # a chat session was a raw pydantic ValidationError
    "chat conversation not an id": (
        lambda c: c.publish_chat("conv 1", 1, [ChatTurn("ann", "hi")]), "agent_id"),
    "chat turn too long": (
        lambda c: c.publish_chat("c1", 1, [ChatTurn("ann", "hi"), ChatTurn("bo", "x" * 9000)]),
        "observation"),
    # dead-lettered by the deployment (or stored in that tenant with auth off), unseen
    "another tenant's transition": (
        lambda c: c.publish(_transition("tb")),
        "transition 0 is for tenant 'tb', this client's tenant is 'acme'"),
    "another tenant's among the client's own": (
        lambda c: c.publish_many(iter([_transition("acme"), _transition("tb", 1)])),
        "transition 1 is for tenant 'tb'"),
}  # fmt: skip


def _transition(tenant: str, step: int = 0) -> Transition:
    return Transition(tenant=tenant, agent_id="a", episode_id="e", step=step, observation="x",
                      action="go")  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_an_invalid_record_and_sends_nothing(case: str) -> None:
    call, named = BAD[case]
    client = Client("127.0.0.1:9092", "acme")
    producer = FakeProducer()
    client._producer = producer  # type: ignore[assignment]
    client._started = True  # noqa: SLF001
    with pytest.raises(InvalidRecord) as err:
        asyncio.run(call(client))  # type: ignore[arg-type]
    assert isinstance(err.value, DmemError) and not err.value.retriable
    assert named in str(err.value)
    assert producer.sent == []


@pytest.mark.parametrize("transport", ["kafka", "http"])
def test_a_transition_of_another_tenant_is_refused_before_anything_is_sent(
    transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the HTTP API refuses it (403) for a token of the client's tenant, over either
    transport, the client's own transitions of the same call included."""
    client = Client("127.0.0.1:9092", "ta", token="tokA", transport=transport,
                    http_url="http://127.0.0.1:1" if transport == "http" else None)  # fmt: skip
    producer = FakeProducer()
    client._producer = producer  # type: ignore[assignment]
    client._started = True  # noqa: SLF001
    posted: list[str] = []

    async def http_call(method: str, path: str, *_: Any, **__: Any) -> tuple[int, bytes]:
        posted.append(path)
        return 202, b""

    monkeypatch.setattr(client, "_http_call", http_call)
    for call in (client.publish(_transition("tb")),
                 client.publish_many([_transition("ta"), _transition("tb", 1)])):  # fmt: skip
        with pytest.raises(InvalidRecord, match="tenant 'tb', this client's tenant is 'ta'"):
            asyncio.run(call)
    assert producer.sent == [] and posted == []


def test_good_weights_are_normalised_and_sent() -> None:
    client = Client("127.0.0.1:9092", "acme")
    producer = FakeProducer()
    client._producer = producer  # type: ignore[assignment]
    client._started = True  # noqa: SLF001
    asyncio.run(client.report_usage("e", "r", {"m": 3.0, "n": 1.0, "o": 0.0}))
    ((topic, value, _),) = producer.sent
    assert topic.endswith("usage") and b'"weights":[0.75,0.25,0.0]' in value
    producer.sent.clear()
    asyncio.run(client.report_usage("e", "r", {"m": 1e308, "n": 1e308}))  # no overflow
    ((topic, value, _),) = producer.sent
    assert b'"weights":[0.5,0.5]' in value


@pytest.mark.parametrize("url", ["notaurl", "127.0.0.1:6066", "ftp://h:1", "http://", "http://h:x"])
def test_an_http_url_that_is_not_one_is_a_config_error_at_once(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it was aiohttp's InvalidUrlClientError out of the first call (a traceback from
    # `dmem search --http`, every MCP tool failing, `dmem wait` pending until its timeout)
    from click.testing import CliRunner

    import dmem.cli as cli
    import dmem.wait
    from schemas.errors import ConfigError

    waited: list[list[str]] = []
    monkeypatch.setattr(
        dmem.wait, "wait_settled", lambda urls, **_: waited.append(urls) or {"waited_s": 0.0}
    )
    with pytest.raises(ConfigError, match="http_url"):
        Client("127.0.0.1:9092", "acme", http_url=url)
    for args in (["search", "q", "--tenant", "t"], ["mcp", "--tenant", "t"],
                 ["wait", "--http", "http://h:1"]):  # fmt: skip
        out = CliRunner().invoke(cli.main, [*args, "--http", url])
        assert out.exit_code == 2 and "--http" in out.output, out.output
        assert repr(url) in out.output, out.output
    assert waited == []  # every value of wait's repeatable --http is checked first


def test_an_http_url_with_a_prefix_is_kept() -> None:
    c = Client("127.0.0.1:9092", "acme", http_url="https://dmem.example:8443/api/")
    assert c.http_url == "https://dmem.example:8443/api"


@pytest.mark.parametrize("tenant", ["", "bad tenant", "a|b", "é", "a" * 129, "t\n"])
def test_a_tenant_that_is_no_id_is_a_config_error_from_the_constructor(tenant: str) -> None:
    from schemas.errors import ConfigError
    from schemas.limits import LIMITS

    assert LIMITS.max_id_chars < 129
    with pytest.raises(ConfigError, match="tenant must be"):
        Client("127.0.0.1:9092", tenant)
    assert Client("127.0.0.1:9092", "acme-1_b.c:d@e/f").tenant == "acme-1_b.c:d@e/f"
