"""The harness commands of the `dmem` CLI: ``bench ...``, ``demo``, ``report`` and
``deploycheck``. They join the `dmem` group through the entry point group ``dmem.cli``
(declared in ``bench/pyproject.toml``); each imports its module when it runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from dmem.cli.common import fail, load_settings
from dmem_bench.deploycheck import deploycheck
from schemas.errors import DmemError

__all__ = ["bench", "demo", "deploycheck", "report"]

F = TypeVar("F", bound=Callable[..., Any])


#: the encoders a harness command can run with
ENCODERS = ("minilm-static", "minilm", "hash")
#: the Gymnasium environments of the rewarded runs
GYM_ENVS = ("cliffwalking", "taxi", "frozenlake")

#: what a LoCoMo ``--data`` may name (`dmem_bench.locomo.load`)
LOCOMO_DATA_HELP = (
    "the LoCoMo conversations: a folder of one JSON file each, or the release's locomo10.json"
)
JSON_OPTION = click.option(
    "--json", "as_json", is_flag=True, help="print one JSON object on the last line"
)
SEED_OPTION = click.option("--seed", type=int, default=7, show_default=True)
GYM_ENV_OPTION = click.option(
    "--env", "env_name", type=click.Choice(GYM_ENVS), default="cliffwalking", show_default=True
)


def encoder_option(default: str | None, help: str | None = None) -> Callable[[F], F]:
    """``--encoder`` (one of `ENCODERS`); ``default`` None leaves the choice to the stack."""
    return click.option(
        "--encoder",
        type=click.Choice(ENCODERS),
        default=default,
        show_default=default is not None,
        help=help,
    )


class SettingsChecked(click.Command):
    """A harness command that reads the DMEM_* settings: a bad one is a usage error (one
    line, exit status 2) before the command starts a broker or reads a data set. Checked
    when the command runs, after its options are parsed, so its ``--help`` needs none."""

    def invoke(self, ctx: click.Context) -> object:
        load_settings()
        return super().invoke(ctx)


@click.command(cls=SettingsChecked)
@GYM_ENV_OPTION
@click.option("--steps", type=int, default=3000, show_default=True)
@SEED_OPTION
@encoder_option(None, help="override DMEM_ENCODER__NAME")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="keep the Milvus Lite data here (default: a fresh temp dir)",
)
@JSON_OPTION
def demo(
    env_name: str, steps: int, seed: int, encoder: str | None, data_dir: Path | None, as_json: bool
) -> None:
    """Embedded end-to-end run: broker + Milvus Lite + write worker + a Gymnasium agent."""
    from dmem_bench.demo import run_demo

    if steps < 1:
        raise click.BadParameter("must be >= 1", param_hint="--steps")
    try:
        summary = run_demo(
            env_name=env_name,
            steps=steps,
            seed=seed,
            encoder=encoder,
            data_dir=data_dir,
            as_json=as_json,
        )
    except DmemError as exc:
        fail(exc)
    if as_json:
        from schemas import dumps

        click.echo(dumps(summary).decode())


def bench_results(
    ctx: click.Context, param: click.Parameter, value: tuple[Path, ...]
) -> tuple[Path, ...]:
    """``--bench-json``'s check: every file holds a benchmark result (`read_bench`),
    refused before the report reads the deployment."""
    from dmem_bench.report import read_bench

    for path in value:
        try:
            read_bench(path)
        except DmemError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


@click.command(cls=SettingsChecked)
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("report.html"),
    show_default=True,
)
@click.option(
    "--bench-json",
    "bench_json",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    multiple=True,
    callback=bench_results,
    help="benchmark result file(s) to include (one JSON object, or the JSON last line of "
    "`dmem bench ... --json`)",
)
@click.option(
    "--bench-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".dmem-bench"),
    show_default=True,
    help="directory of `dmem bench` results (*.json)",
)
@click.option(
    "--max-events",
    type=click.IntRange(1),
    default=200_000,
    show_default=True,
    help="newest MemoryEvents read from the memories topic",
)
@click.option(
    "--data-dir",
    "up_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="data dir of the running `dmem up` to report on (default: "
    "the one running `dmem up`, or DMEM_* settings if DMEM_KAFKA__BROKER is set)",
)
@click.option("--json", "as_json", is_flag=True, help="print a summary as one JSON line")
def report(
    out: Path,
    bench_json: tuple[Path, ...],
    bench_dir: Path,
    max_events: int,
    up_dir: Path | None,
    as_json: bool,
) -> None:
    """Self-contained HTML report of a running `dmem up` or a deployment (DMEM_* settings)."""
    from dmem_bench.report import build_report, locate
    from streams.admin import check_broker

    try:
        settings, up = locate(up_dir)
        asyncio.run(check_broker(settings.kafka))
        summary = build_report(
            settings, out, bench_json=bench_json, bench_dir=bench_dir, max_events=max_events, up=up
        )
    except (DmemError, OSError) as exc:  # OSError: the --out file cannot be written
        fail(exc)
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(f"wrote {out} ({summary['events']} events, {summary['images']} plots)")


class SettingsCheckedGroup(click.Group):
    """A group whose commands are `SettingsChecked`."""

    command_class = SettingsChecked


@click.group(cls=SettingsCheckedGroup)
def bench() -> None:
    """Benchmarks (long; not run in CI)."""


BACKEND_OPTION = click.option(
    "--backend",
    type=click.Choice(["embedded", "containers", "auto"]),
    default="embedded",
    show_default=True,
    help="embedded: Tansu + the Milvus server wheel; containers: Apache Kafka + Milvus "
    "standalone from docker-compose.yml's images (needs a Docker engine)",
)


@bench.command("retrieval")
@click.option(
    "--memories",
    type=click.IntRange(1),
    default=100_000,
    show_default=True,
    help="memories loaded for the latency tenant",
)
@click.option(
    "--requests",
    type=click.IntRange(1),
    default=300,
    show_default=True,
    help="sequential requests per transport and repeat",
)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@encoder_option("hash", help="encoder of the stored rows and of the worker")
@click.option(
    "--env",
    "envs",
    type=click.Choice(GYM_ENVS),
    multiple=True,
    help="Gymnasium run(s) of the quality probes [default: cliffwalking and taxi]",
)
@click.option(
    "--steps",
    type=click.IntRange(1),
    default=3000,
    show_default=True,
    help="steps of each quality run",
)
@SEED_OPTION
@click.option(
    "--warmup",
    type=click.IntRange(0),
    default=20,
    show_default=True,
    help="untimed requests per transport before measuring",
)
@click.option(
    "--embedded",
    is_flag=True,
    help="also measure the stack `dmem up` starts (loaded through HTTP ingest)",
)
@BACKEND_OPTION
@JSON_OPTION
def bench_retrieval(
    memories: int,
    requests: int,
    repeats: int,
    encoder: str,
    envs: tuple[str, ...],
    steps: int,
    seed: int,
    warmup: int,
    embedded: bool,
    backend: str,
    as_json: bool,
) -> None:
    """Read-path latency (Kafka, HTTP, raw Milvus) and critical-event probe quality."""
    from dmem_bench.retrieval import BenchConfig
    from dmem_bench.retrieval import main as run_bench

    cfg = BenchConfig(
        memories=memories,
        requests=requests,
        repeats=repeats,
        encoder=encoder,
        envs=envs or ("cliffwalking", "taxi"),
        steps=steps,
        seed=seed,
        warmup=warmup,
        embedded=embedded,
        backend=backend,
    )
    try:
        run_bench(cfg, as_json)
    except DmemError as exc:
        fail(exc)


@bench.command("embedded")
@click.option(
    "--memories",
    type=click.IntRange(1),
    default=10_000,
    show_default=True,
    help="memories the tenant must hold (loaded through HTTP ingest)",
)
@click.option(
    "--queries",
    type=click.IntRange(1),
    default=200,
    show_default=True,
    help="sequential HTTP searches (k=5) per repeat",
)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--warmup", type=click.IntRange(0), default=20, show_default=True)
@click.option(
    "--batch",
    type=click.IntRange(1),
    default=1000,
    show_default=True,
    help="transitions per POST /v1/transitions",
)
@encoder_option(None, help="worker encoder [default: the worker's default, as `dmem up`]")
@click.option(
    "--milvus",
    type=click.Choice(["auto", "server", "lite"]),
    default="auto",
    show_default=True,
    help="as `dmem up --milvus`",
)
@click.option(
    "--new-connections",
    is_flag=True,
    help="time each HTTP call over a new connection [default: kept alive, as the SDK's client]",
)
@click.option(
    "--ab-ref",
    default=None,
    metavar="REV",
    help="then compare search latency with git revision REV's worker on the same stack",
)
@click.option(
    "--ab-rounds",
    type=click.IntRange(1),
    default=2,
    show_default=True,
    help="A/B rounds (each: REV, this checkout, this checkout, REV)",
)
@JSON_OPTION
def bench_embedded(
    memories: int,
    queries: int,
    repeats: int,
    warmup: int,
    batch: int,
    encoder: str | None,
    milvus: str,
    new_connections: bool,
    ab_ref: str | None,
    ab_rounds: int,
    as_json: bool,
) -> None:
    """The `dmem up` stack: HTTP ingest, search latency, librdkafka clients, OpenAPI, page."""
    from dmem_bench.embedded import EmbeddedConfig
    from dmem_bench.embedded import main as run_embedded

    cfg = EmbeddedConfig(
        memories=memories,
        queries=queries,
        repeats=repeats,
        warmup=warmup,
        batch=batch,
        encoder=encoder,
        milvus=milvus,
        keep_alive=not new_connections,
        ab_ref=ab_ref,
        ab_rounds=ab_rounds,
    )
    try:
        run_embedded(cfg, as_json)
    except DmemError as exc:
        fail(exc)


@bench.command("write")
@click.option("--transitions", type=click.IntRange(1), default=50_000, show_default=True)
@encoder_option("hash")
@click.option(
    "--workers",
    default="1",
    show_default=True,
    help="write workers; a list (1,2,3) measures each count in one run (scaling)",
)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option(
    "--batch-size",
    type=click.IntRange(1),
    default=1024,
    show_default=True,
    help="worker micro-batch (DMEM_WRITE__BATCH_SIZE)",
)
@click.option(
    "--batch-within",
    type=float,
    default=0.1,
    show_default=True,
    help="worker micro-batch window in seconds",
)
@click.option(
    "--latency-transitions",
    type=click.IntRange(1),
    default=None,
    help="paced transitions of the latency run [default: ~15 s worth]",
)
@click.option("--milvus-uri", default=None, help="use this Milvus server instead of starting one")
@BACKEND_OPTION
@JSON_OPTION
def bench_write(
    transitions: int,
    encoder: str,
    workers: str,
    repeats: int,
    batch_size: int,
    batch_within: float,
    latency_transitions: int | None,
    milvus_uri: str | None,
    backend: str,
    as_json: bool,
) -> None:
    """Write-path throughput and latency vs raw Kafka, encoder and Milvus baselines."""
    from dmem_bench import write as bw

    try:
        counts = [int(x) for x in workers.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or any(not 1 <= n <= 8 for n in counts):
        raise click.BadParameter(
            f"expected worker counts 1-8 like 1,2,3 (got {workers!r})", param_hint="--workers"
        )
    try:
        out = bw.run_scaling(
            counts,
            transitions=transitions,
            encoder=encoder,
            repeats=repeats,
            batch_size=batch_size,
            batch_within_s=batch_within,
            latency_transitions=latency_transitions,
            milvus_uri=milvus_uri,
            backend=backend,
        )
    except DmemError as exc:
        fail(exc)
    if as_json:
        bw.emit_json(out)


@bench.command("encoders")
@click.option(
    "--encoders",
    default="hash,minilm,minilm-static",
    show_default=True,
    help="comma-separated encoder names",
)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option(
    "--transitions",
    type=click.IntRange(100),
    default=4000,
    show_default=True,
    help="write-path transitions per repeat",
)
@click.option("--threads", type=click.IntRange(1), default=2, show_default=True)
@click.option(
    "--data",
    type=click.Path(exists=True, path_type=Path),
    required=True,
    help=LOCOMO_DATA_HELP,
)
@click.option(
    "--conversations",
    type=click.IntRange(1),
    default=None,
    help="use only the first N conversations",
)
@click.option(
    "--minilm-transitions",
    type=click.IntRange(100),
    default=2000,
    show_default=True,
    help="write-path transitions per repeat for torch minilm (at most --transitions)",
)
@click.option("--no-pipeline", is_flag=True, help="skip the write-path measurement")
@JSON_OPTION
def bench_encoders(
    encoders: str,
    repeats: int,
    transitions: int,
    threads: int,
    data: Path,
    conversations: int | None,
    minilm_transitions: int,
    no_pipeline: bool,
    as_json: bool,
) -> None:
    """Encoders: raw speed, write-path speed and real-text retrieval quality, in one run."""
    from dmem_bench import encoders as be

    names = [x.strip() for x in encoders.split(",") if x.strip()]
    try:
        out = be.run(
            names,
            repeats=repeats,
            transitions=transitions,
            threads=threads,
            data=data,
            conversations=conversations,
            pipeline=not no_pipeline,
            minilm_transitions=minilm_transitions,
        )
    except (DmemError, FileNotFoundError) as exc:
        fail(exc)
    if as_json:
        be.emit_json(out)


@bench.command("longmemeval")
@click.option(
    "--data",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="the LongMemEval questions: one JSON object a line, or the release's JSON array "
    "(gzip when it ends in .gz)",
)
@click.option("--questions", type=click.IntRange(0), default=0, show_default=True, help="0: all")
@click.option(
    "--per-type",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="at most this many questions of each type (0: all)",
)
@encoder_option("minilm-static")
@click.option("--batch", type=click.IntRange(1), default=64, show_default=True)
@click.option(
    "--cache",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="keep the turns' embeddings in this folder between runs",
)
@click.option(
    "--ranking",
    type=click.Choice(["served", "cosine"]),
    default="served",
    show_default=True,
    help="dmem's hits as the respond role serves them (its ranking over the kept turns), "
    "or by exact cosine over the kept turns",
)
@click.option(
    "--as-of/--no-as-of",
    default=False,
    show_default=True,
    help="the served search passes the question's date (as_of): memories written after it "
    "are left out, recency is measured from it (with --ranking served only)",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path(".dmem-bench/longmemeval.png"),
    show_default=True,
    help="recall per question type against store-all",
)
@JSON_OPTION
def bench_longmemeval(
    data: Path,
    questions: int,
    per_type: int,
    encoder: str,
    batch: int,
    cache: Path | None,
    ranking: str,
    as_of: bool,
    plot: Path,
    as_json: bool,
) -> None:
    """Conversations on LongMemEval, in process on the product's defaults: storage, turn
    and session recall at 5 and 10 per question type against store-all cosine."""
    from dmem_bench.common import emit_json, note
    from dmem_bench.longmemeval import plot as plot_recall
    from dmem_bench.longmemeval import run, table

    try:
        res = run(
            data,
            questions=questions,
            per_type=per_type,
            encoder=encoder,
            batch=batch,
            cache=cache,
            ranking=ranking,
            as_of=as_of,
            progress=note,
        )
        table(res)
        plot_recall(plot, res)
    except (DmemError, FileNotFoundError, ValueError, OSError) as exc:
        fail(exc)
    note(f"plot: {plot}")
    if as_json:
        emit_json(res)


@bench.command("locomo")
@click.option(
    "--data",
    type=click.Path(exists=True, path_type=Path),
    required=True,
    help=LOCOMO_DATA_HELP,
)
@click.option(
    "--noise",
    type=click.FloatRange(0.0, 4.0),
    default=0.0,
    show_default=True,
    help="noise turns from other conversations per real turn (0.5 = one per two)",
)
@encoder_option("minilm")
@click.option("--conversations", type=click.IntRange(0), default=0, help="first N (0 = all)")
@click.option(
    "--turns", type=click.IntRange(0), default=0, help="first N turns per conversation (0 = all)"
)
@click.option(
    "--questions",
    type=click.IntRange(0),
    default=0,
    help="first N scored questions per conversation (0 = all)",
)
@SEED_OPTION
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path(".dmem-bench/locomo.png"),
    show_default=True,
)
@click.option(
    "--baseline-cache",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="keep the store-all baseline's embeddings in this .npz "
    "between runs (bench side only; the worker always encodes)",
)
@click.option(
    "--milvus",
    type=click.Choice(["auto", "lite", "server"]),
    default="auto",
    show_default=True,
    help="Milvus of the embedded stack (auto: the server when installed, else Lite)",
)
@click.option(
    "--replay",
    is_flag=True,
    help="offline: the real write pipeline over cached embeddings, exact cosine "
    "over what it kept (no broker, no Milvus; minutes; `dmem_bench.locomo_replay`; "
    "--plot, --milvus and --baseline-cache are the live run's and do not apply)",
)
@click.option(
    "--replay-cache",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".dmem-bench"),
    show_default=True,
    help="--replay: folder of the embedding cache (locomo-embed-<encoder>.npz)",
)
@click.option(
    "--replay-batch",
    type=click.IntRange(1),
    default=64,
    show_default=True,
    help="--replay: turns per write batch",
)
@JSON_OPTION
def bench_locomo(
    data: Path,
    noise: float,
    encoder: str,
    conversations: int,
    turns: int,
    questions: int,
    seed: int,
    plot: Path,
    baseline_cache: Path | None,
    milvus: str,
    replay: bool,
    replay_cache: Path,
    replay_batch: int,
    as_json: bool,
) -> None:
    """Reward-free conversational memory on LoCoMo: evidence recall vs store-all cosine."""
    from dmem_bench.locomo import LocomoConfig
    from dmem_bench.locomo import main as run_locomo

    try:
        cfg = LocomoConfig(
            data=data,
            noise=noise,
            encoder=encoder,
            conversations=conversations,
            turns=turns,
            questions=questions,
            seed=seed,
            plot=plot,
            baseline_cache=baseline_cache,
            milvus=milvus,
        )
        if replay:
            from dmem_bench.locomo_replay import main as run_replay

            run_replay(cfg, as_json, cache=replay_cache, batch=replay_batch)
            return
        run_locomo(cfg, as_json)
    except (DmemError, FileNotFoundError, ValueError) as exc:
        fail(exc)


@bench.command("chaos")
@click.option("--transitions", type=click.IntRange(1), default=20_000, show_default=True)
@click.option("--tenants", type=click.IntRange(2), default=3, show_default=True)
@click.option(
    "--kills",
    type=click.IntRange(0),
    default=3,
    show_default=True,
    help="kill -9 a random write worker this many times (one inside the outage)",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 8),
    default=1,
    show_default=True,
    help="write workers in the consumer group (each kill is a rebalance)",
)
@click.option(
    "--outage-s",
    type=click.FloatRange(0),
    default=30.0,
    show_default=True,
    help="seconds the Milvus server is down mid-stream (0: no outage)",
)
@click.option(
    "--broker-pause-s",
    type=click.FloatRange(0),
    default=5.0,
    show_default=True,
    help="seconds the broker is paused (SIGSTOP) late in the stream (0: none)",
)
@click.option(
    "--rate",
    type=click.FloatRange(1),
    default=250.0,
    show_default=True,
    help="records published per second",
)
@click.option(
    "--bad-every",
    type=click.IntRange(0),
    default=20,
    show_default=True,
    help="one fuzzed bad record after every N valid ones (0: none)",
)
@click.option(
    "--hostile-every",
    type=click.IntRange(0),
    default=10,
    show_default=True,
    help="one hostile transition reusing another tenant's id per N valid ones",
)
@click.option(
    "--hostile-feedback",
    type=click.IntRange(0),
    default=200,
    show_default=True,
    help="hostile thumbs on other tenants' memory ids, after the stream",
)
@click.option(
    "--hostile-episodes",
    type=click.IntRange(0),
    default=20,
    show_default=True,
    help="hostile usage reports (10 foreign ids each) + outcomes",
)
@click.option(
    "--hostile-forgets",
    type=click.IntRange(0),
    default=50,
    show_default=True,
    help="hostile forget requests for other tenants' memory ids",
)
@click.option(
    "--kafka-hostile",
    type=click.IntRange(0),
    default=1200,
    show_default=True,
    help="hostile Kafka records (reads, writes, forgets, credit, poisoned checkpoints) "
    "against one tenant, bare or signed with the intruder's own token",
)
@SEED_OPTION
@JSON_OPTION
def bench_chaos(
    transitions: int,
    tenants: int,
    kills: int,
    workers: int,
    outage_s: float,
    broker_pause_s: float,
    rate: float,
    bad_every: int,
    hostile_every: int,
    hostile_feedback: int,
    hostile_episodes: int,
    hostile_forgets: int,
    kafka_hostile: int,
    seed: int,
    as_json: bool,
) -> None:
    """Crash (kill -9), Milvus outage and fuzzed input against the real stack; counts loss."""
    from dmem_bench.chaos import ChaosConfig
    from dmem_bench.chaos import main as run_chaos

    cfg = ChaosConfig(
        transitions=transitions,
        tenants=tenants,
        kills=kills,
        outage_s=outage_s,
        broker_pause_s=broker_pause_s,
        rate=rate,
        bad_every=bad_every,
        hostile_every=hostile_every,
        hostile_feedback=hostile_feedback,
        hostile_episodes=hostile_episodes,
        hostile_forgets=hostile_forgets,
        kafka_hostile=kafka_hostile,
        seed=seed,
        workers=workers,
    )
    try:
        run_chaos(cfg, as_json)
    except DmemError as exc:
        fail(exc)


@bench.command("credit")
@click.option("--episodes", type=click.IntRange(1), default=300, show_default=True)
@click.option("--scenarios", type=click.IntRange(1, 24), default=20, show_default=True)
@click.option("--seeds", type=click.IntRange(1, 10), default=3, show_default=True,
              help="worlds played (seeds 7, 8, ...), each with both rankings")  # fmt: skip
@encoder_option("minilm-static")
@JSON_OPTION
def bench_credit(episodes: int, scenarios: int, seeds: int, encoder: str, as_json: bool) -> None:
    """Delayed-credit task through the real pipeline: hybrid vs semantic ranking."""
    from dmem_bench.credit import CreditConfig
    from dmem_bench.credit import main as run_credit

    cfg = CreditConfig(
        episodes=episodes,
        scenarios=scenarios,
        seeds=tuple(range(7, 7 + seeds)),
        encoder=encoder,
    )
    try:
        run_credit(cfg, as_json)
    except DmemError as exc:
        fail(exc)


@bench.command("sciworld")
@click.option(
    "--env",
    type=click.Choice(["sciworld", "twx-coin", "twx-cookingworld"]),
    default="sciworld",
    show_default=True,
    help="ScienceWorld, or a TextWorldExpress game as the second environment",
)
@click.option(
    "--task",
    "tasks",
    multiple=True,
    help="ScienceWorld task (repeatable; default: six tasks of the allowed list)",
)
@click.option("--train-variations", type=click.IntRange(1), default=4, show_default=True)
@click.option("--test-variations", type=click.IntRange(1), default=2, show_default=True)
@click.option("--random-steps", type=click.IntRange(1), default=20, show_default=True)
@click.option("--loop-max-steps", type=click.IntRange(1), default=30, show_default=True)
@click.option(
    "--loop-repeats",
    type=click.IntRange(1),
    default=2,
    show_default=True,
    help="closed-loop episodes per test variation and condition (paired seeds)",
)
@encoder_option("minilm")
@click.option(
    "--settle-s",
    type=click.FloatRange(0.0),
    default=25.0,
    show_default=True,
    help="least wait for outcomes and maintenance before the final scan",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--play-cache",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="JSON file of played episodes to reuse (written when absent)",
)
@click.option(
    "--publish",
    type=click.Choice(["episode", "step"]),
    default="episode",
    show_default=True,
    help="stored stream in lockstep per episode, or per step as a live agent sends it",
)
@click.option(
    "--credit-between",
    type=click.Choice(["settled", "async"]),
    default="settled",
    show_default=True,
    help="closed loop: wait until the worker has applied an episode's credit before the next "
    "episode, or go on at once (the next episodes may or may not see it)",
)
@JSON_OPTION
def bench_sciworld(
    env: str,
    tasks: tuple[str, ...],
    train_variations: int,
    test_variations: int,
    random_steps: int,
    loop_max_steps: int,
    loop_repeats: int,
    encoder: str,
    settle_s: float,
    seed: int,
    play_cache: Path | None,
    publish: str,
    credit_between: str,
    as_json: bool,
) -> None:
    """ScienceWorld through the real stack: gate, hindsight, ranking, closed loop."""
    from dmem_bench.sciworld import SciConfig
    from dmem_bench.sciworld import main as run_sci
    from dmem_bench.sciworld_env import DEFAULT_TASKS
    from dmem_bench.twx_env import ENVS

    default = DEFAULT_TASKS if env == "sciworld" else (ENVS[env],)
    try:
        cfg = SciConfig(
            tasks=tuple(tasks) or default,
            env=env,
            train_variations=train_variations,
            test_variations=test_variations,
            random_steps=random_steps,
            loop_max_steps=loop_max_steps,
            loop_repeats=loop_repeats,
            encoder=encoder,
            settle_s=settle_s,
            seed=seed,
            play_cache=play_cache,
            publish=publish,
            credit_between=credit_between,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    try:
        run_sci(cfg, as_json)
    except DmemError as exc:
        fail(exc)


@bench.command("replay")
@click.option(
    "--steps",
    type=click.IntRange(1),
    default=600,
    show_default=True,
    help="rewarded stream: Gymnasium steps (each episode's usage and outcome follow it)",
)
@click.option(
    "--chat-turns",
    type=click.IntRange(1),
    default=120,
    show_default=True,
    help="chat stream: turns (sessions of 12, three days apart)",
)
@GYM_ENV_OPTION
@SEED_OPTION
@encoder_option(None, help="encoder of the stack [default: the stack's, minilm-static]")
@click.option(
    "--variants",
    default="full,one,restart,shifted,hog,import",
    show_default=True,
    help="comma-separated ways to process each stream (at least two; also lockstep, "
    "lockstep-shifted)",
)
@click.option(
    "--streams",
    "stream_names",
    default="rewarded,chat",
    show_default=True,
    help="comma-separated streams",
)
@JSON_OPTION
def bench_replay(steps: int, chat_turns: int, env_name: str, seed: int, encoder: str | None,
                 variants: str, stream_names: str, as_json: bool) -> None:  # fmt: skip
    """The same streams processed live, record by record, after a restart, shifted 400
    days, beside a CPU hog and imported: the same memory every time."""
    import dmem_bench.replay as br

    chosen = tuple(v for v in variants.split(",") if v)
    names = tuple(s for s in stream_names.split(",") if s)
    if len(chosen) < 2 or not set(chosen) <= set(br.VARIANTS):
        fail(
            click.BadParameter(f"at least two of {', '.join(br.VARIANTS)}", param_hint="--variants")
        )
    if not names or not set(names) <= set(br.STREAMS):
        fail(click.BadParameter(f"some of {', '.join(br.STREAMS)}", param_hint="--streams"))
    try:
        out = br.run(steps=steps, env_name=env_name, seed=seed, encoder=encoder,
                     chat_turns=chat_turns, variants=chosen, streams=names)  # fmt: skip
    except DmemError as exc:
        fail(exc)
    if as_json:
        br.emit_json(out)


@bench.command("maintenance")
@click.option(
    "--steps",
    type=click.IntRange(1),
    default=20_000,
    show_default=True,
    help="Gymnasium steps streamed through the pipeline",
)
@GYM_ENV_OPTION
@SEED_OPTION
@click.option("--core-capacity", type=click.IntRange(1), default=150, show_default=True)
@click.option("--buffer-capacity", type=click.IntRange(1), default=300, show_default=True)
@click.option(
    "--scale",
    default="1000,10000,100000",
    show_default=True,
    help="memory counts of the decay-pass cost measurement (comma separated)",
)
@click.option(
    "--passes",
    type=click.IntRange(1),
    default=20,
    show_default=True,
    help="decay passes timed at each scale",
)
@click.option(
    "--milvus-uri",
    default=None,
    help="Milvus server for the scale measurement [default: start the embedded one, "
    "else Milvus Lite]",
)
@JSON_OPTION
def bench_maintenance(
    steps: int,
    env_name: str,
    seed: int,
    core_capacity: int,
    buffer_capacity: int,
    scale: str,
    passes: int,
    milvus_uri: str | None,
    as_json: bool,
) -> None:
    """Dedup/decay/capacity through the real pipeline, and decay-pass cost vs size."""
    import dmem_bench.maintenance as bm

    try:
        sizes = [int(x) for x in scale.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter("comma-separated integers", param_hint="--scale") from None
    try:
        out = bm.run(
            steps=steps,
            env_name=env_name,
            seed=seed,
            core_capacity=core_capacity,
            buffer_capacity=buffer_capacity,
            sizes=sizes,
            passes=passes,
            milvus_uri=milvus_uri,
        )
    except DmemError as exc:
        fail(exc)
    if as_json:
        bm.emit_json(out)
