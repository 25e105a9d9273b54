"""`dmem.wait.wait_settled` with ``components``: only the named parts of each worker's
settle report must be settled; a worker without a part has none of its work, but a
part no worker reports (a misspelled name) and a worker that reports nothing are
never settled."""

from __future__ import annotations

from typing import Any

import pytest

from dmem import wait
from schemas.errors import ServiceUnavailable


def report(credit: bool | None, access: bool) -> dict[str, Any]:
    settle: dict[str, Any] = {"access": {"settled": access, "pending": {}}}
    if credit is not None:
        settle["credit"] = {"settled": credit, "pending": {}}
    return {"settled": access and credit is not False, "settle": settle}


def test_components_wait_for_the_named_parts_only(monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = {"http://a": report(True, False), "http://b": report(None, False)}
    monkeypatch.setattr(wait, "health", lambda url: bodies[url])
    done = wait.wait_settled(list(bodies), timeout_s=2.0, quiet_s=0.05, poll_s=0.01,
                             components=["credit"])  # fmt: skip
    assert done["settled"] is True
    with pytest.raises(ServiceUnavailable, match="not settled"):  # everything: access pends
        wait.wait_settled(list(bodies), timeout_s=0.2, quiet_s=0.05, poll_s=0.01)


def test_a_pending_named_part_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wait, "health", lambda url: report(False, True))
    with pytest.raises(ServiceUnavailable, match="not settled"):
        wait.wait_settled(["http://a"], timeout_s=0.2, quiet_s=0.05, poll_s=0.01,
                          components=["credit"])  # fmt: skip


@pytest.mark.parametrize(
    "bodies",
    [
        {"http://a": report(None, True)},  # nobody reports credit
        {"http://a": report(True, True), "http://b": {}},  # b answers without a report
    ],
)
def test_a_part_nobody_reports_is_not_settled(
    monkeypatch: pytest.MonkeyPatch, bodies: dict[str, Any]
) -> None:
    monkeypatch.setattr(wait, "health", lambda url: bodies[url])
    with pytest.raises(ServiceUnavailable, match="not settled"):
        wait.wait_settled(list(bodies), timeout_s=0.2, quiet_s=0.05, poll_s=0.01,
                          components=["credit"])  # fmt: skip


def test_the_cli_waits_for_the_parts_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from dmem.cli.client import wait_cmd

    monkeypatch.setattr(wait, "health", lambda url: report(True, False))
    args = ["--settled", "--http", "http://a", "--quiet", "0.05", "--json"]
    out = CliRunner().invoke(wait_cmd, [*args, "--part", "credit", "--timeout", "2"])
    assert out.exit_code == 0, out.output
    assert '"settled": true' in out.output
    out = CliRunner().invoke(wait_cmd, [*args, "--timeout", "0.2"])  # every part: access pends
    assert out.exit_code == 2 and "not settled" in out.output
    out = CliRunner().invoke(wait_cmd, [*args, "--part", "gate"])
    assert out.exit_code == 2 and "gate" in out.output


def test_an_unreachable_worker_is_named_when_the_wait_gives_up() -> None:
    import socket

    import pytest

    from dmem.wait import wait_settled
    from schemas.errors import ServiceUnavailable

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(ServiceUnavailable) as err:
        wait_settled([url], timeout_s=0.3, poll_s=0.1)
    assert f"{url}/health" in str(err.value)


class Clock:
    """`dmem.wait`'s time: ``sleep`` moves ``monotonic`` on, so a wait runs the same
    number of polls however loaded the machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_the_wait_says_what_it_still_waits_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # a long wait says, every `every_s`, which worker and which part it waits for, on
    # stderr (stdout stays the answer)
    from click.testing import CliRunner

    from dmem.cli.client import wait_cmd

    monkeypatch.setattr(wait, "time", Clock())
    monkeypatch.setattr(wait, "health", lambda url: report(False, True))
    said: list[str] = []
    with pytest.raises(ServiceUnavailable):  # polls at 0, 0.25, ... 3.75 s: gives up there
        wait.wait_settled(["http://a"], timeout_s=3.5, poll_s=0.25, progress=said.append,
                          every_s=1.0)  # fmt: skip
    assert [s.split(",")[0] for s in said] == [f"dmem wait: {t} s of 3.5 s" for t in (1, 2, 3)]
    assert all("still waiting" in s and "http://a" in s and "credit" in s for s in said), said
    assert "access" not in said[0]  # settled parts are not named

    monkeypatch.setattr(wait, "PROGRESS_EVERY_S", 0.5)
    args = ["--settled", "--http", "http://a", "--timeout", "1", "--json"]
    out = CliRunner().invoke(wait_cmd, args)
    assert out.exit_code == 2 and "still waiting" in out.stderr and "credit" in out.stderr
    assert "still waiting" not in out.stdout
    out = CliRunner().invoke(wait_cmd, [*args, "--no-progress"])
    assert out.exit_code == 2 and "still waiting" not in out.stderr
