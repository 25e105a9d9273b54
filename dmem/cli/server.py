"""The `dmem` commands that run the stream processor or open the store: they import it
when they run, so they need the ``server`` extra (`server_imports` says so otherwise)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from dmem.cli.common import (
    DEPLOYMENT_SETTINGS,
    check_signing,
    fail,
    ident,
    load_settings,
    no_stack_hint,
    server_imports,
    stack_settings,
    tenant_name,
)
from schemas.errors import ConfigError, DmemError


@click.command()
@click.option(
    "--role",
    type=click.Choice(["write", "respond", "jobs", "all"]),
    default="all",
    show_default=True,
)
def worker(role: str) -> None:
    """Run a worker (settings from DMEM_* environment variables)."""
    with server_imports("worker"):
        from streams.worker import run_worker

    settings = load_settings()
    try:
        run_worker(settings, role)
    except DmemError as exc:
        fail(exc)


@click.command()
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("dmem-data"),
    show_default=True,
    envvar="DMEM_DATA_DIR",  # where the other commands look for the stack
    show_envvar=True,
)
@click.option("--json", "as_json", is_flag=True, help="print the addresses as one JSON line")
@click.option(
    "--milvus",
    type=click.Choice(["auto", "server", "lite"]),
    default="auto",
    show_default=True,
    help="auto: the embedded Milvus server when installed (indexed), else Lite",
)
@click.option(
    "--kafka-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="the embedded broker's port [default: a free one each start]",
)
@click.option(
    "--http-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="the HTTP API's port (live page, /v1) [default: a free one each start]",
)
def up(
    data_dir: Path, as_json: bool, milvus: str, kafka_port: int | None, http_port: int | None
) -> None:
    """Run the local stack (embedded broker, Milvus, workers) until Ctrl-C."""
    with server_imports("up"):
        from streams.local.stack import run_up

    try:
        run_up(data_dir=data_dir, as_json=as_json, milvus=milvus, kafka_port=kafka_port,
               http_port=http_port)  # fmt: skip
    except DmemError as exc:
        fail(exc)


#: what each store command can use while a `dmem up` holds its Milvus Lite file
LITE_MEANWHILE = {
    "inspect": "GET /v1/stats and GET /v1/memories",
    "forget": "POST /v1/forget",
}


def _store(settings: Any, command: str) -> Any:
    """A connected MemoryStore for CLI tools (dim from the encoder settings).

    Milvus Lite opens in one process only: on the Lite file of a running `dmem up`,
    `ConfigError` naming that stack and what to do instead. No Lite file where one is
    looked for: `ConfigError` naming where the memories are (the Milvus of the stack
    running on the data dir) or which setting to give."""
    from milvus import MemoryStore
    from operators.encoders import encoder_dim
    from streams.local.announce import STATE_NAME, read_state

    m = settings.milvus
    lite = settings.milvus_uri
    up = None if "://" in lite else read_state(settings.data_dir / STATE_NAME)
    if up is not None and Path(str(up.get("milvus"))).resolve() == Path(lite).resolve():
        raise ConfigError(
            f"the running `dmem up` (pid {up['pid']}, HTTP {up.get('http')}) holds the Milvus "
            f"Lite file {lite}, which opens in one process only: stop it (Ctrl-C) and run "
            f"`DMEM_DATA_DIR={up.get('data_dir', settings.data_dir)} dmem {command}` again, "
            f"or start it with `dmem up --milvus server`, whose store "
            f"`dmem {command}` reads while it runs; meanwhile its HTTP API serves "
            f"{LITE_MEANWHILE[command]}"
        )

    if not m.uri and not Path(lite).exists() and up is not None:
        # the stack on this data dir keeps its store elsewhere (a Milvus server): the data
        # dir is right, the deployment's Milvus has to be named, or found with the stack
        named = " and ".join(k for k in DEPLOYMENT_SETTINGS if os.environ.get(k))
        unset = f", or unset {named} so that `dmem {command}` finds the stack itself"
        raise ConfigError(
            f"no Milvus Lite file at {lite}: the `dmem up` on {settings.data_dir} (pid "
            f"{up['pid']}) keeps its memories in Milvus at {up.get('milvus')}: set "
            f"DMEM_MILVUS__URI={up.get('milvus')}{unset if named else ''}"
        )
    if not m.uri and not Path(lite).exists():  # an empty store made here answers nothing
        raise ConfigError(
            f"no Milvus Lite file at {lite}: `dmem {command}` works on a deployment's store; "
            "set DMEM_DATA_DIR to the data dir of the `dmem up` that wrote it (its `data` "
            "line), or DMEM_MILVUS__URI to the deployment's Milvus"
        )
    dim = encoder_dim(settings.encoder.name, settings.encoder.dim)
    return MemoryStore(
        settings.milvus_uri, collection=m.collection, dim=dim, token=m.token, timeout_s=m.timeout_s
    ).connect()


@click.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--tenant", default=None, callback=tenant_name, help="put every record into this tenant"
)
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(0),
    default=120.0,
    show_default=True,
    help="seconds to wait at the end for the write path to store the transitions "
    "(records are published in the file's order)",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object on the last line")
def import_cmd(file: Path, tenant: str | None, wait_s: float, as_json: bool) -> None:
    """Publish a JSONL file of historical transitions, usage, outcomes and feedback.

    Event times (`ts`) are kept; invalid lines are reported (line: reason) and make the
    exit status 1; records are idempotent by id (re-importing stores nothing twice)."""
    with server_imports("import"):
        from dmem.importer import run_import

    settings, up = stack_settings()
    try:
        check_signing(settings, up, "import")
        rep = run_import(settings, file, tenant=tenant, wait_s=wait_s)
    except DmemError as exc:
        fail(exc, no_stack_hint(up))
    out = rep.as_dict()
    if as_json:
        click.echo(json.dumps(out))
    else:
        click.echo(
            f"imported {out['transition']} transitions, {out['outcome']} outcomes, "
            f"{out['feedback']} feedback, {out['usage']} usage from {out['lines']} lines; "
            f"{out['invalid']} invalid"
        )
    if rep.invalid:
        sys.exit(1)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def migrate(as_json: bool) -> None:
    """Rewrite a collection created before tenant-scoped storage keys (stop the workers first).

    Rows keep every field; the primary key becomes ``tenant|id``.
    Safe to run again after a crash, and a no-op on a current collection.
    """
    with server_imports("migrate"):
        from milvus import MemoryStore
        from operators.encoders import encoder_dim

    settings = load_settings()
    m = settings.milvus

    dim = encoder_dim(settings.encoder.name, settings.encoder.dim)
    try:
        out = MemoryStore(
            settings.milvus_uri,
            collection=m.collection,
            dim=dim,
            token=m.token,
            timeout_s=m.timeout_s,
        ).migrate_storage_keys()
    except DmemError as exc:
        fail(exc)
    out["collection"] = m.collection
    if as_json:
        click.echo(json.dumps(out))
    else:
        click.echo(
            f"collection {m.collection}: {out['status']}"
            + (f" ({out['rows']} rows)" if out["rows"] else "")
        )


@click.command("inspect")
@click.option("--tenant", required=True, callback=tenant_name, help="tenant to inspect")
@click.option("--top", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option(
    "--events/--no-events",
    default=True,
    show_default=True,
    help="read recent merges/evictions from the memories topic (needs the broker)",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def inspect_cmd(tenant: str, top: int, events: bool, as_json: bool) -> None:
    """Counts, age/priority distributions, top memories, recent merges/evictions."""
    with server_imports("inspect"):
        from streams.admin import check_broker
        from streams.jobs.inspection import inspect_tenant, recent_events
        from streams.jobs.rows import policy_from

    settings, _ = stack_settings()

    async def recent() -> list[dict[str, Any]]:
        await check_broker(settings.kafka)  # a broker out of reach: one line naming it
        return await asyncio.wait_for(recent_events(settings, tenant), timeout=15)

    try:
        store = _store(settings, "inspect")
        try:
            report = inspect_tenant(store, tenant, policy_from(settings), top=top)
        finally:
            store.close()
        report["recent"] = None
        if events:
            try:
                report["recent"] = asyncio.run(recent())
            except Exception as exc:  # noqa: BLE001 - the store part is still useful
                why = str(exc) if isinstance(exc, DmemError) else f"{type(exc).__name__}: {exc}"
                report["recent_error"] = f"{why} (--no-events skips reading them)"
    except DmemError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(report))
        return
    c = report["counts"]
    click.echo(
        f"tenant {tenant}: core {c['core']}, buffer {c['buffer']} "
        f"(capacity {report['capacity']['core']}/{report['capacity']['buffer']}), "
        f"{report['merged_total']} duplicates merged into {report['merged_rows']} rows"
    )
    for name in ("age_s", "priority"):
        for part, q in report[name].items():
            click.echo(
                f"  {name:<8} {part:<6} "
                + " ".join(f"{k}={v:.3g}" if v is not None else f"{k}=-" for k, v in q.items())
            )
    click.echo(f"next decay pass would do: {report['next_pass'] or 'nothing'}")
    click.echo("top by priority:")
    for i, t in enumerate(report["top"], 1):
        click.echo(
            f"  {i}. [{t['partition']} p={t['priority']:.3f} rpe={t['rpe']:+.2f} "
            f"x{t['merged_count']} hits={t['hits']}] {t['text']!r} -> {t['action']}"
        )
    if report.get("recent"):
        click.echo("recent maintenance events:")
        for ev in report["recent"]:
            click.echo(
                f"  {ev.get('ts')} {ev.get('kind'):<9} {ev.get('memory_id')} {ev.get('reason', '')}"
            )
    elif report.get("recent_error"):
        click.echo(f"recent events unavailable: {report['recent_error']}")


@click.command()
@click.option(
    "--tenant", required=True, callback=tenant_name, help="tenant whose memories to forget"
)
@click.option(
    "--agent", "agent_id", default=None, callback=ident, help="only this agent's memories"
)
@click.option("--memory", "memory_id", default=None, callback=ident, help="only this memory")
@click.option(
    "--audit/--no-audit",
    default=True,
    show_default=True,
    help="emit a forgotten MemoryEvent per deleted memory (needs the broker)",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def forget(
    tenant: str, agent_id: str | None, memory_id: str | None, audit: bool, as_json: bool
) -> None:
    """Delete every memory of the scope from Milvus (and emit `forgotten` audit events)."""
    with server_imports("forget"):
        from streams.admin import check_broker
        from streams.jobs.forget import ForgetIncomplete, emit_events, forget_scope

    settings, up = stack_settings()
    try:
        if audit:  # fail before deleting anything if the audit trail cannot be written
            check_signing(settings, up, "forget")
            asyncio.run(check_broker(settings.kafka))
        store = _store(settings, "forget")
        try:
            events = forget_scope(store, tenant, agent_id=agent_id, memory_id=memory_id)
        except ForgetIncomplete as exc:  # what was deleted is still audited and announced
            if audit:
                asyncio.run(emit_events(settings, exc.events))
            raise
        finally:
            store.close()
        if audit and events:
            asyncio.run(emit_events(settings, events))
    except DmemError as exc:
        fail(exc)
    out = {
        "tenant": tenant,
        "agent": agent_id,
        "memory": memory_id,
        "forgotten": len(events),
        "audited": len(events) if audit else 0,
    }
    if memory_id is not None and events and events[0].memory_id != memory_id:
        out["folded_into"] = events[0].memory_id  # the survivor that held its content
    if as_json:
        click.echo(json.dumps(out))
    else:
        click.echo(
            f"forgot {len(events)} memories of tenant {tenant}"
            + (f" agent {agent_id}" if agent_id else "")
            + (f" memory {memory_id}" if memory_id else "")
            + (f" (folded into {out['folded_into']})" if "folded_into" in out else "")
        )
