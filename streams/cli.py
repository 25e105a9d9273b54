"""The `dmem` command line.

Errors are one line on stderr and a non-zero exit (2 for bad settings or an
unreachable service), never a traceback wall; ``DMEM_DEBUG=1`` shows tracebacks.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from schemas.errors import DmemError


def _settings(**overrides: Any) -> Any:
    from streams.settings import Settings

    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ()))
        raise click.ClickException(f"bad setting {loc}: {first.get('msg')}") from None


def _fail(exc: BaseException) -> None:
    if os.environ.get("DMEM_DEBUG"):
        raise exc
    click.echo(f"dmem: error: {exc}", err=True)
    sys.exit(2)


@click.group()
def main() -> None:
    """dmem: dopamine-gated, outcome-credited memory for agents, over Kafka and Milvus."""


@main.command()
@click.option(
    "--role",
    type=click.Choice(["write", "respond", "jobs", "all"]),
    default="all",
    show_default=True,
)
def worker(role: str) -> None:
    """Run a worker (settings from DMEM_* environment variables)."""
    import faust

    from streams.admin import check_broker, ensure_topics
    from streams.app import build_app

    settings = _settings()
    try:
        asyncio.run(check_broker(settings.kafka))
        asyncio.run(ensure_topics(settings))
        from streams.codec import register

        register()
        app = build_app(settings, role)
    except DmemError as exc:
        _fail(exc)
    w = faust.Worker(app, loglevel=settings.log_level, quiet=True, redirect_stdouts=False)
    w.execute_from_commandline()


@main.group()
def topics() -> None:
    """Topic administration."""


@topics.command("create")
def topics_create() -> None:
    """Create every dmem topic on the configured broker (idempotent)."""
    from streams.admin import check_broker, ensure_topics

    settings = _settings()
    try:
        asyncio.run(check_broker(settings.kafka))
        created = asyncio.run(ensure_topics(settings))
    except DmemError as exc:
        _fail(exc)
    click.echo(f"created {len(created)} topics" + (": " + ", ".join(created) if created else ""))


@main.group()
def schemas() -> None:
    """Payload schemas."""


@schemas.command("export")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def schemas_export(directory: Path) -> None:
    """Write the JSON Schema of every payload into DIRECTORY."""
    from schemas import export_json_schemas

    for p in export_json_schemas(directory):
        click.echo(str(p))


@main.command()
@click.option(
    "--env",
    "env_name",
    type=click.Choice(["cliffwalking", "taxi", "frozenlake"]),
    default="cliffwalking",
    show_default=True,
)
@click.option("--steps", type=int, default=3000, show_default=True)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option(
    "--encoder",
    type=click.Choice(["minilm", "hash"]),
    default=None,
    help="override DMEM_ENCODER__NAME",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="keep the Milvus Lite data here (default: a fresh temp dir)",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object on the last line")
def demo(
    env_name: str, steps: int, seed: int, encoder: str | None, data_dir: Path | None, as_json: bool
) -> None:
    """Embedded end-to-end run: broker + Milvus Lite + write worker + a Gymnasium agent."""
    from streams.demo import run_demo

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
        _fail(exc)
    if as_json:
        from schemas import dumps

        click.echo(dumps(summary).decode())


@main.command()
@click.argument("query")
@click.option("--tenant", required=True, help="tenant whose memories to search")
@click.option("-k", "k", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--agent", "agent_id", default=None, help="only this agent's memories")
@click.option("--lambda", "lam", type=click.FloatRange(0, 1), default=None,
              help="override the semantic weight")
@click.option("--http", "http_url", default=None,
              help="search over HTTP at this base URL instead of Kafka")
@click.option("--timeout", "timeout_s", type=float, default=5.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the hits as JSON")
def search(query: str, tenant: str, k: int, agent_id: str | None, lam: float | None,
           http_url: str | None, timeout_s: float, as_json: bool) -> None:
    """Search a running deployment (settings from DMEM_* env vars)."""
    from streams.admin import check_broker, kafka_client_kwargs
    from streams.client import DmemClient

    settings = _settings()
    kw = kafka_client_kwargs(settings.kafka)
    bootstrap = kw.pop("bootstrap_servers")

    async def go() -> list[Any]:
        if http_url is None:
            await check_broker(settings.kafka)
        client = DmemClient(bootstrap, tenant, topic_prefix=settings.kafka.topic_prefix,
                            http_url=http_url, transport="http" if http_url else "kafka",
                            timeout_s=timeout_s, client_kwargs=kw)
        async with client:
            return await client.search(query, k, agent_id=agent_id, lambda_=lam)

    try:
        hits = asyncio.run(go())
    except (DmemError, ValidationError) as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps([h.model_dump(mode="json", by_alias=True) for h in hits]))
        return
    if not hits:
        click.echo("no memories found")
    for i, h in enumerate(hits, 1):
        click.echo(f"{i}. [{h.partition} v{h.valence:+d} score {h.score:.3f}] {h.text!r} "
                   f"-> {h.action} (reward {h.reward:g}, rpe {h.rpe:.2f}, utility {h.utility:.2f})")


@main.command()
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("dmem-data"),
    show_default=True,
)
@click.option("--json", "as_json", is_flag=True, help="print the addresses as one JSON line")
def up(data_dir: Path, as_json: bool) -> None:
    """Run the local stack (embedded broker, Milvus Lite, workers) until Ctrl-C."""
    from streams.local import run_up

    try:
        run_up(data_dir=data_dir, as_json=as_json)
    except DmemError as exc:
        _fail(exc)


from streams.deploy import deploycheck  # noqa: E402 - heavy imports are lazy inside

main.add_command(deploycheck)


if __name__ == "__main__":
    main()
