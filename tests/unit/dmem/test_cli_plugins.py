"""The `dmem` CLI's seams: harness commands plug in through the ``dmem.cli`` entry
points, a missing harness or server install is one clear message, and `dmem` never
imports the harness itself."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import dmem.cli as cli
from dmem.cli.common import server_imports

ROOT = Path(__file__).resolve().parents[3]


@click.command()
def hello() -> None:
    """A plug-in command for the test."""
    click.echo("hello from a plug-in")


def test_help_lists_the_product_commands() -> None:
    out = CliRunner().invoke(cli.main, ["--help"])
    assert out.exit_code == 0, out.output
    for name in (
        "worker",
        "up",
        "search",
        "wait",
        "schemas",
        "topics",
        "import",
        "migrate",
        "inspect",
        "forget",
        "mcp",
    ):
        assert name in out.output, name


def test_entry_points_add_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    eps = [
        EntryPoint(name="hello", value=f"{__name__}:hello", group=cli.ENTRY_POINT_GROUP),
        EntryPoint(name="broken", value="no_such_module_x:cmd", group=cli.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(cli, "entry_points", lambda group: eps if group == "dmem.cli" else [])
    group = click.Group("dmem")
    cli._add_plugins(group)
    assert sorted(group.commands) == ["hello"]
    out = CliRunner().invoke(group, ["hello"])
    assert out.exit_code == 0 and "hello from a plug-in" in out.output


@pytest.mark.parametrize("args", [["demo", "--json"], ["bench", "write", "--help"]])
def test_a_missing_harness_says_where_it_runs(args: list[str]) -> None:
    group = cli._Main("dmem")
    out = CliRunner().invoke(group, args)
    assert out.exit_code == 2  # a missing install, as for the server commands
    assert out.output.startswith("dmem: error: `dmem ")
    assert "runs from a checkout" in out.output and "pip install -e ./bench" in out.output


def test_a_server_command_without_the_server_extra_says_what_to_install() -> None:
    with pytest.raises(click.ClickException) as err:
        with server_imports("worker"):
            import no_such_server_module_x  # noqa: F401
    assert "`dmem worker` needs `pip install 'dmem[server]'`" in err.value.message
    assert err.value.exit_code == 2


def test_a_bad_setting_is_a_usage_error_with_status_2(monkeypatch: pytest.MonkeyPatch) -> None:
    from dmem.cli.common import load_settings

    monkeypatch.setenv("DMEM_GATE__Q_HIGH", "5")
    with pytest.raises(click.ClickException) as err:
        load_settings()
    assert err.value.exit_code == 2 and "bad setting gate.q_high" in err.value.message


def test_dmem_never_names_the_harness() -> None:
    """Not even as a string for importlib: the entry points are the only way in."""
    hits = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "dmem").rglob("*.py")
        if "dmem_bench" in p.read_text()
    ]
    assert hits == []


@pytest.mark.parametrize(
    "args", [["demo", "--steps", "1"], ["bench", "longmemeval", "--data"], ["report"]]
)
def test_the_harness_commands_refuse_a_bad_setting_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str]
) -> None:
    """Before any broker, store or data set is touched: exit status 2 and the setting's
    name, not a pydantic traceback (the data file is not JSON: read, it fails otherwise)."""
    from dmem_bench.cli import bench, demo, report

    data = tmp_path / "questions.jsonl"
    data.write_text("not json\n")
    monkeypatch.setenv("DMEM_GATE__Q_LOW", "abc")
    group = click.Group("dmem", commands={"demo": demo, "bench": bench, "report": report})
    out = CliRunner().invoke(group, args + ([str(data)] if args[-1] == "--data" else []))
    assert out.exit_code == 2, out.output
    assert "bad setting gate.q_low" in out.output
    assert "Traceback" not in out.output and isinstance(out.exception, SystemExit)


@pytest.mark.parametrize("args", [["demo", "--help"], ["bench", "credit", "--help"]])
def test_a_harness_commands_help_needs_no_valid_setting(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    from dmem_bench.cli import bench, demo

    monkeypatch.setenv("DMEM_GATE__Q_LOW", "abc")
    group = click.Group("dmem", commands={"demo": demo, "bench": bench})
    out = CliRunner().invoke(group, args)
    assert out.exit_code == 0, out.output
    assert out.output.startswith("Usage: dmem ") and "bad setting" not in out.output
