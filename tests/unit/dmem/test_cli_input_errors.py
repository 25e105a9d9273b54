"""Operator commands refuse bad input before they touch anything: one line on stderr,
exit status 2 (a name no payload accepts is not a tenant with 0 memories)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

import dmem.cli as cli
from dmem.cli.common import one_line
from schemas import RetrievalRequest
from schemas.errors import InvalidRecord


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["inspect", "--tenant", "bad|tenant"], "--tenant"),
        (["forget", "--tenant", "bad|tenant"], "--tenant"),
        (["search", "q", "--tenant", "bad|tenant"], "--tenant"),
        (["import", "/dev/null", "--tenant", "a b"], "--tenant"),
        (["search", "q", "--tenant", "t", "--timeout", "-1"], "--timeout"),
        (["wait", "--settled", "--timeout", "-1"], "--timeout"),
        (["wait", "--settled", "--quiet", "-1"], "--quiet"),
        (["import", "/dev/null", "--wait", "-1"], "--wait"),
        (["schemas", "export", "/proc/no/such/dir"], "No such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], named: str) -> None:
    out = CliRunner().invoke(cli.main, args)
    assert out.exit_code == 2, out.output
    assert named in out.output and "Traceback" not in out.output


def test_a_validation_error_is_one_line_naming_each_field() -> None:
    with pytest.raises(ValidationError) as err:
        RetrievalRequest.model_validate({"request_id": "r", "tenant": "a|b", "k": 0, "query": "q"})
    line = one_line(InvalidRecord("invalid RetrievalRequest: ..."))
    assert line == "invalid RetrievalRequest: ..."
    wrapped = InvalidRecord(f"invalid RetrievalRequest: {err.value}")
    wrapped.__cause__ = err.value
    line = one_line(wrapped)
    assert "\n" not in line and line.startswith("invalid RetrievalRequest: ")
    assert "tenant: " in line and "k: " in line


@pytest.mark.parametrize(
    "args",
    [
        ["forget", "--tenant", "t", "--agent", "", "--no-audit"],
        ["forget", "--tenant", "t", "--agent", "a b", "--no-audit"],
        ["forget", "--tenant", "t", "--memory", "", "--no-audit"],
        ["forget", "--tenant", "t", "--memory", "m|1", "--no-audit"],
    ],
)
def test_forget_refuses_a_bad_scope_before_opening_the_store(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--agent ""` (an unset shell variable) narrowed nothing: the whole tenant was deleted
    import dmem.cli.server as server

    def no_store(_settings: object) -> None:
        raise AssertionError("the store must not be opened")

    monkeypatch.setattr(server, "_store", no_store)
    out = CliRunner().invoke(cli.main, args)
    assert out.exit_code == 2, out.output
    assert "must match" in out.output and "Traceback" not in out.output


@pytest.mark.parametrize(
    "args",
    [
        ["search", "q", "--tenant", "t", "--agent", ""],
        ["mcp", "--tenant", "t", "--agent", "a b"],
    ],
)
def test_an_agent_option_is_an_id(args: list[str]) -> None:
    out = CliRunner().invoke(cli.main, args)
    assert out.exit_code == 2 and "--agent" in out.output, out.output


@pytest.mark.parametrize(
    "args", [["inspect", "--tenant", "t1", "--no-events"], ["forget", "--tenant", "t1"]]
)
def test_store_commands_on_a_data_dir_without_a_store_say_where_to_look(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no store at the default Lite path (another folder than the stack's), the
    command names the data dir to set instead of creating an empty store and reporting
    0 memories from it."""
    for k in ("DMEM_MILVUS__URI", "DMEM_KAFKA__BROKER"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("DMEM_DATA_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("DMEM_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("DMEM_ENCODER__NAME", "hash")
    out = CliRunner().invoke(cli.main, [*args, "--no-audit"] if args[0] == "forget" else args)
    assert out.exit_code == 2, out.output
    assert "no Milvus Lite file at" in out.output and "DMEM_DATA_DIR" in out.output
    assert not (tmp_path / "empty").exists()


@pytest.mark.parametrize(
    "args", [["inspect", "--tenant", "t1", "--no-events"], ["forget", "--tenant", "t1"]]
)
def test_store_commands_on_a_server_stacks_data_dir_name_its_milvus(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DMEM_DATA_DIR names a running `dmem up` that keeps its store in a Milvus server,
    and DMEM_KAFKA__BROKER skips finding it: the line names that server's URI to set and
    the variable to unset, not the DMEM_DATA_DIR already set."""
    import socket

    from streams.local.announce import announce

    data_dir = tmp_path / "stack"
    with socket.socket() as broker:  # the running stack's broker answers
        broker.bind(("127.0.0.1", 0))
        broker.listen()
        kafka = f"127.0.0.1:{broker.getsockname()[1]}"
        announce(tmp_path / "run", data_dir, {"kafka": kafka, "milvus": "http://127.0.0.1:19531",
                                              "data_dir": str(data_dir)})  # fmt: skip
        monkeypatch.delenv("DMEM_MILVUS__URI", raising=False)
        monkeypatch.setenv("DMEM_KAFKA__BROKER", kafka)
        monkeypatch.setenv("DMEM_DATA_DIR", str(data_dir))
        monkeypatch.setenv("DMEM_RUNTIME_DIR", str(tmp_path / "run"))
        monkeypatch.setenv("DMEM_ENCODER__NAME", "hash")
        out = CliRunner().invoke(cli.main, [*args, "--no-audit"] if args[0] == "forget" else args)
    assert out.exit_code == 2, out.output
    (line,) = out.stderr.strip().splitlines()
    assert "keeps its memories in Milvus at http://127.0.0.1:19531" in line, line
    assert "set DMEM_MILVUS__URI=http://127.0.0.1:19531" in line, line
    assert f"unset DMEM_KAFKA__BROKER so that `dmem {args[0]}` finds the stack" in line, line
    assert "set DMEM_DATA_DIR" not in line, line
    assert not (data_dir / "milvus.db").exists()


def test_import_counts_every_kind_in_its_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text line names usage records as `--json` counts them."""
    import dmem.importer as importer

    rep = importer.ImportReport(lines=5, published=5)
    rep.counts.update(transition=2, outcome=1, feedback=1, usage=1)
    monkeypatch.setattr(importer, "run_import", lambda *_, **__: rep)
    monkeypatch.setenv("DMEM_KAFKA__BROKER", "127.0.0.1:1")  # named: no stack looked for
    (tmp_path / "run.jsonl").write_text("")
    out = CliRunner().invoke(cli.main, ["import", str(tmp_path / "run.jsonl")])
    assert out.exit_code == 0, out.output
    assert out.stdout.strip() == (
        "imported 2 transitions, 1 outcomes, 1 feedback, 1 usage from 5 lines; 0 invalid"
    )


def test_up_runs_on_dmem_data_dir_where_the_other_commands_look_for_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import streams.local.stack as stack

    seen: list[Path] = []
    monkeypatch.setattr(stack, "run_up", lambda data_dir, **_: seen.append(data_dir))
    monkeypatch.setenv("DMEM_DATA_DIR", str(tmp_path / "d1"))
    assert CliRunner().invoke(cli.main, ["up"]).exit_code == 0
    assert CliRunner().invoke(cli.main, ["up", "--data-dir", str(tmp_path / "d2")]).exit_code == 0
    assert seen == [tmp_path / "d1", tmp_path / "d2"]  # the option wins over the variable
