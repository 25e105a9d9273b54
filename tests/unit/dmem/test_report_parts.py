"""`dmem report` without a stack: finding `dmem up` (as the client commands do too), time
axes, tables, gate overview."""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from dmem.cli.common import UsageError, stack_settings
from dmem_bench.report import ReportData, _fig, _time_axis, gate_overview, locate, render
from schemas.errors import ConfigError
from streams.local.announce import STATE_NAME, announce, client_env, running, withdraw
from streams.settings import Settings


@pytest.fixture
def no_deployment_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for k in list(os.environ):
        if k.startswith("DMEM_"):
            monkeypatch.delenv(k)
    run = tmp_path / "run"
    monkeypatch.setenv("DMEM_RUNTIME_DIR", str(run))
    return run


@pytest.fixture
def listening() -> Iterator[str]:
    """A port that accepts connections, standing in for a running stack's broker."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        yield f"127.0.0.1:{srv.getsockname()[1]}"


def state(data_dir: Path, kafka: str) -> dict[str, object]:
    return {"kafka": kafka, "milvus": str(data_dir / "milvus.db"), "http": "http://127.0.0.1:1",
            "ui": "http://127.0.0.1:1/ui/", "data_dir": str(data_dir), "topic_prefix": "x.",
            "app_id": "up-app", "started_ms": 1}  # fmt: skip


def two_stacks(run: Path, tmp_path: Path, kafka: str) -> None:
    """Two live `dmem up` announced in ``run`` (this process stands in for both)."""
    announce(run, tmp_path / "d1", state(tmp_path / "d1", kafka))
    announce(run / "other", tmp_path / "d2", state(tmp_path / "d2", kafka))
    (run / "999.json").write_bytes((run / "other" / f"{os.getpid()}.json").read_bytes())


def test_locate_finds_the_one_running_up(no_deployment_env: Path, tmp_path: Path,
                                         listening: str) -> None:  # fmt: skip
    with pytest.raises(ConfigError, match="no running `dmem up` found.*--data-dir"):
        locate()
    paths = announce(no_deployment_env, tmp_path / "d1", state(tmp_path / "d1", listening))
    assert {p.stat().st_mode & 0o777 for p in paths} == {0o600}  # addresses: owner only
    settings, up = locate()
    assert up is not None and up["pid"] == os.getpid()
    assert settings.kafka.bootstrap == listening
    assert settings.milvus_uri == str(tmp_path / "d1" / "milvus.db")
    assert settings.topic("memories") == "x.memories" and settings.app_id == "up-app"
    # a second stack: the user has to choose, and is told the exact flags
    two_stacks(no_deployment_env, tmp_path, listening)
    with pytest.raises(ConfigError, match=r"2 `dmem up` stacks are running, pass one of: --data-d"):
        locate()
    assert locate(tmp_path / "d1")[1]["data_dir"] == str(tmp_path / "d1")  # --data-dir decides
    with pytest.MonkeyPatch.context() as mp:  # or DMEM_DATA_DIR, as for the client commands
        mp.setenv("DMEM_DATA_DIR", str(tmp_path / "d2"))
        assert locate()[1]["data_dir"] == str(tmp_path / "d2")
    withdraw(paths)
    assert not (tmp_path / "d1" / STATE_NAME).exists()
    with pytest.raises(ConfigError, match="no running `dmem up` on"):
        locate(tmp_path / "d1")


def test_stale_state_files_are_ignored(no_deployment_env: Path, tmp_path: Path,
                                       listening: str) -> None:  # fmt: skip
    no_deployment_env.mkdir(parents=True)
    dead = {**state(tmp_path, listening), "pid": 2**22 + 12345}  # no such process
    (no_deployment_env / "1.json").write_bytes(orjson.dumps(dead))
    (no_deployment_env / "2.json").write_text("{broken")
    reused = {**state(tmp_path, "127.0.0.1:1"), "pid": os.getpid()}  # pid alive, broker gone
    (no_deployment_env / "3.json").write_bytes(orjson.dumps(reused))
    assert running(no_deployment_env) == []
    (no_deployment_env / "4.json").write_bytes(orjson.dumps({**reused, "kafka": listening}))
    assert len(running(no_deployment_env)) == 1


def test_explicit_settings_win(no_deployment_env: Path, monkeypatch: pytest.MonkeyPatch,
                               tmp_path: Path) -> None:  # fmt: skip
    announce(no_deployment_env, tmp_path, state(tmp_path, "h:1"))
    monkeypatch.setenv("DMEM_KAFKA__BROKER", "kafka://elsewhere:9092")
    settings, up = locate()
    assert up is None and settings.kafka.bootstrap == "elsewhere:9092"
    assert client_env(state(tmp_path, "h:1"))["DMEM_KAFKA__BROKER"] == "kafka://h:1"


def test_client_commands_find_the_running_up(no_deployment_env: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            listening: str) -> None:  # fmt: skip
    assert stack_settings()[1] is None  # none running: the settings as given
    announce(no_deployment_env, tmp_path / "d1", state(tmp_path / "d1", listening))
    settings, up = stack_settings()
    assert up is not None and settings.kafka.bootstrap == listening
    assert settings.topic("memories") == "x.memories" and settings.app_id == "up-app"
    monkeypatch.setenv("DMEM_APP_ID", "mine")  # a variable given wins over the stack's
    assert stack_settings()[0].app_id == "mine"
    two_stacks(no_deployment_env, tmp_path, listening)
    with pytest.raises(UsageError, match=r"2 `dmem up` stacks are running, pass one of: DMEM_DA"):
        stack_settings()
    monkeypatch.setenv("DMEM_DATA_DIR", str(tmp_path / "d2"))  # picks one
    assert stack_settings()[1]["data_dir"] == str(tmp_path / "d2")  # type: ignore[index]
    monkeypatch.setenv("DMEM_KAFKA__BROKER", "kafka://elsewhere:9092")  # names the deployment
    settings, up = stack_settings()
    assert up is None and settings.kafka.bootstrap == "elsewhere:9092"


def test_time_axis_labels_are_clock_times() -> None:
    import matplotlib.pyplot as plt

    for span_s, pattern in ((600, r"^\d\d:\d\d:\d\d$"), (4, r"^\d\d:\d\d:\d\d\.\d$")):
        fig, ax = _fig("t")
        t0 = dt.datetime(2026, 12, 1, 8, 55, 0)
        xs = [t0, t0 + dt.timedelta(seconds=span_s)]
        ax.plot(xs, [0, 1])
        _time_axis(ax, [0.0, span_s * 1000.0])
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        plt.close(fig)
        assert len(labels) >= 3 and all(re.match(pattern, x) for x in labels), labels
        if span_s == 600:
            assert labels[0].startswith("08:5")  # the wall clock, not shifted by a zone


def test_render_has_no_empty_tables() -> None:
    data = ReportData(benches=[
        ("credit.json", {"result": {"hybrid_success": 0.8, "episodes": 300},
                         "curves": {"hybrid": [0, 1]}}),
        ("curves.json", {"curves": {"hybrid": [0, 1]}}),
    ])  # fmt: skip
    page = render(data, Settings())
    for table in re.findall(r"<table>.*?</table>", page, flags=re.S):
        assert "<td>" in table, table
    assert "result.hybrid_success" in page  # nested results are flattened, not dropped
    assert "no data because this result holds no numbers or strings (only dict)" in page
    assert "no data because no gate decision is on the memories topic yet" in page


def test_gate_overview_plots_the_gate_score() -> None:
    # a chat: extrinsic 0, the gate score (rpe_smoothed) is w * intrinsic
    events = [{"kind": "dropped" if i % 2 else "written", "tenant": "chat", "route":
               "drop" if i % 2 else "buffer", "rpe_smoothed": 0.1 * (i % 20), "theta_low": 0.7,
               "theta_high": 1.2, "rpe": 0.0, "ts": i} for i in range(100)]  # fmt: skip
    g = gate_overview(events)["chat"]
    assert g["decisions"] == 100 and g["nonzero"] == 95
    assert (g["theta_low"], g["theta_high"]) == (0.7, 1.2)
    assert g["axis_top"] == pytest.approx(2.4)  # 2 x theta_high: the thresholds are in view


def test_several_running_ups_are_one_line_and_exit_2(no_deployment_env: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     listening: str) -> None:  # fmt: skip
    from click.testing import CliRunner

    from dmem import wait
    from dmem.cli import main
    from dmem.client import Client

    two_stacks(no_deployment_env, tmp_path, listening)
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("")
    for args in (["search", "q", "--tenant", "t1"], ["wait", "--settled"],
                 ["topics", "create"], ["import", str(jsonl)], ["inspect", "--tenant", "t1"],
                 ["forget", "--tenant", "t1"], ["mcp", "--tenant", "t1"]):  # fmt: skip
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 2, (args, out.output, out.exception)
        (line,) = out.stderr.strip().splitlines()
        assert line.startswith("dmem: error: 2 `dmem up` stacks are running, pass one of: "
                               "DMEM_DATA_DIR="), line  # fmt: skip
        assert str(tmp_path / "d1") in line and str(tmp_path / "d2") in line, line
    # the flags name the deployment: nothing to discover
    monkeypatch.setattr(wait, "health", lambda url: {"settled": True, "settle": {}})
    for flags in (["--settled"], []):  # settling is the one condition: the flag may go
        out = CliRunner().invoke(main, ["wait", *flags, "--http", "http://a", "--quiet", "0"])
        assert out.exit_code == 0 and "settled after" in out.stdout, (out.output, out.exception)
    asked: list[str | None] = []

    async def search(self: Client, query: str, k: int, **_: object) -> list[object]:
        asked.append(self.http_url)
        return []

    monkeypatch.setattr(Client, "search", search)
    out = CliRunner().invoke(main, ["search", "q", "--tenant", "t1", "--http", "http://h:1"])
    assert out.exit_code == 0 and "no memories found" in out.stdout, (out.output, out.exception)
    assert asked == ["http://h:1"]
    import dmem.integrations.mcp as mcp_integration

    served: list[str | None] = []

    class Server:
        def __init__(self, make_client: Any) -> None:
            self.make_client = make_client

        def run(self, transport: str) -> None:
            served.append(self.make_client().http_url)

    monkeypatch.setattr(mcp_integration, "build_server", lambda make, **_: Server(make))
    out = CliRunner().invoke(main, ["mcp", "--tenant", "t1", "--http", "http://h:1"])
    assert out.exit_code == 0 and served == ["http://h:1"], (out.output, out.exception)
    # one stack running: every tool goes over its HTTP API (forget and stats need it)
    (no_deployment_env / "999.json").unlink()
    (no_deployment_env / "other").rename(no_deployment_env / "gone")
    out = CliRunner().invoke(main, ["mcp", "--tenant", "t1"])
    assert out.exit_code == 0 and served[-1] == "http://127.0.0.1:1", (out.output, served)


@pytest.mark.parametrize(
    ("name", "value"),
    [("DMEM_MILVUS__URI", "http://prod:19530"), ("DMEM_KAFKA__BROKER", "kafka://prod:9092")],
)
def test_a_setting_that_names_a_deployment_turns_discovery_off(
    no_deployment_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listening: str,
    name: str, value: str,
) -> None:  # fmt: skip
    announce(no_deployment_env, tmp_path / "d1", state(tmp_path / "d1", listening))
    monkeypatch.setenv(name, value)
    settings, up = stack_settings()
    assert up is None  # one deployment: the settings' and defaults', not half the stack's
    assert settings.kafka.bootstrap != listening and settings.app_id == "dmem"
    assert settings.milvus_uri != str(tmp_path / "d1" / "milvus.db")
    assert settings.topic("memories") == "dmem.memories"


def test_locate_follows_the_client_commands_rule(no_deployment_env: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 listening: str) -> None:  # fmt: skip
    d1 = tmp_path / "d1"
    announce(no_deployment_env, d1, state(d1, listening))
    monkeypatch.setenv("DMEM_APP_ID", "mine")  # a variable given wins over the stack's
    for found in (locate(), locate(d1), stack_settings()):
        assert found[1] is not None and found[0].kafka.bootstrap == listening
        assert found[0].app_id == "mine" and found[0].topic("memories") == "x.memories"
    monkeypatch.setenv("DMEM_MILVUS__URI", "http://prod:19530")  # names a deployment
    settings, up = locate()
    assert up is None and settings.kafka.bootstrap != listening
    assert settings.milvus_uri == "http://prod:19530"
    with pytest.raises(ConfigError, match=r"DMEM_MILVUS__URI names another deployment"):
        locate(d1)  # never the stack's broker beside that Milvus
    # the stack's own values (its `export` line) name the same deployment: no clash
    monkeypatch.setenv("DMEM_MILVUS__URI", str(d1 / "milvus.db"))
    for broker in (listening, f"kafka://{listening}"):  # as the export line, or with scheme
        monkeypatch.setenv("DMEM_KAFKA__BROKER", broker)
        settings, up = locate(d1)
        assert up is not None and settings.kafka.bootstrap == listening


def test_an_unreachable_default_deployment_says_no_dmem_up_runs(
    no_deployment_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no `dmem up` running and no deployment named, a broker out of reach says
    so and what to do; where the user named the deployment, its own error is enough."""
    from click.testing import CliRunner

    import streams.admin
    from dmem.cli import main
    from schemas.errors import BrokerUnavailable

    async def away(kafka: object) -> None:
        raise BrokerUnavailable("cannot reach the Kafka broker at 127.0.0.1:9092")

    monkeypatch.setattr(streams.admin, "check_broker", away)
    for args in (["search", "q", "--tenant", "t1"], ["topics", "create"]):
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 2, (args, out.output, out.exception)
        (line,) = out.stderr.strip().splitlines()
        assert line.startswith("dmem: error: cannot reach the Kafka broker"), line
        assert "no running `dmem up` was found: start one (`dmem up`)" in line, line
    monkeypatch.setenv("DMEM_KAFKA__BROKER", "127.0.0.1:9092")
    out = CliRunner().invoke(main, ["search", "q", "--tenant", "t1"])
    assert out.exit_code == 2 and "cannot reach" in out.stderr
    assert "dmem up" not in out.stderr, out.stderr


def test_bench_json_must_exist_and_hold_a_benchmark_result(no_deployment_env: Path,
                                                          tmp_path: Path) -> None:  # fmt: skip
    """A missing file, JSON Lines of records, or a record alone are usage errors naming the
    file, before any deployment is looked for; a result, whole or as the last line of a
    saved `--json` output, is read."""
    from click.testing import CliRunner

    from dmem_bench.cli import report
    from dmem_bench.report import load_benches

    records = tmp_path / "some.jsonl"
    records.write_text('{"tenant": "t", "observation": "o"}\n{"tenant": "t", "outcome": 1}\n')
    record = tmp_path / "one.jsonl"
    record.write_text('{"tenant": "t", "observation": "o"}\n')
    text = tmp_path / "notes.json"
    text.write_text("pipeline_tps: 5\n")
    refused = ((tmp_path / "nope.json", "does not exist"),
               (records, "is not a dmem benchmark result: it holds 2 JSON objects"),
               (record, "is not a dmem benchmark result: it holds a dmem record"),
               (text, "is not a dmem benchmark result: its last line is not a JSON"))  # fmt: skip
    for path, why in refused:
        out = CliRunner().invoke(report, ["--bench-json", str(path), "--out", str(tmp_path / "r")])
        assert out.exit_code == 2, (path, out.output)
        assert "no running `dmem up`" not in out.output  # refused before looking for one
        error = out.output.strip().splitlines()[-1]
        assert str(path) in error and why in error, error
    saved = tmp_path / "write.json"  # a saved --json run: progress lines, then the result
    saved.write_text('encoding...\n{"bench": "write", "pipeline_tps": 5000.0}\n')
    pretty = tmp_path / "credit.json"  # a recorded result, indented
    pretty.write_text(orjson.dumps({"episodes": 3}, option=orjson.OPT_INDENT_2).decode())
    bench_dir = tmp_path / "bench"
    bench_dir.mkdir()
    (bench_dir / "probes.json").write_text("[1, 2]")  # other JSON a bench keeps: passed over
    found = dict(load_benches([saved, pretty], bench_dir))
    assert found == {"write.json": {"bench": "write", "pipeline_tps": 5000.0},
                     "credit.json": {"episodes": 3}}  # fmt: skip
    with pytest.raises(ConfigError, match="one.jsonl is not a dmem benchmark result"):
        load_benches([record], bench_dir)


def test_partition_sizes_take_merged_memories_out() -> None:
    """``merged`` names the memory folded into another: it leaves the store, as an
    evicted or forgotten one does (the survivor stays where it is)."""
    from dmem_bench.report import partition_sizes

    ev = [{"kind": "written", "memory_id": m, "partition": p, "ts": i}
          for i, (m, p) in enumerate((("a", "core"), ("b", "core"), ("c", "buffer")))]  # fmt: skip
    ev += [{"kind": "merged", "memory_id": "b", "partition": "core", "ts": 5},
           {"kind": "forgotten", "memory_id": "c", "partition": "buffer", "ts": 6},
           {"kind": "merged", "memory_id": "never-seen", "partition": "core", "ts": 7}]  # fmt: skip
    ts, series = partition_sizes(ev)
    assert ts == [0, 1, 2, 5, 6]
    assert series == {"core": [1, 2, 2, 1, 1], "buffer": [0, 0, 1, 1, 0]}
