"""The `dmem` commands that need only the core install: they talk to a running
deployment (Kafka, HTTP) or write files."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from dmem.cli.common import (
    UsageError,
    fail,
    ident,
    load_settings,
    no_stack_hint,
    stack_settings,
    tenant_name,
)
from dmem.client import Client
from schemas.errors import DmemError


def deployment_client(
    settings: Any, tenant: str, http_url: str | None, timeout_s: float, token: str | None
) -> Client:
    """A client of the deployment the DMEM_* settings describe: over HTTP when a base
    URL is given, else over Kafka with the settings' connection options."""
    from streams.admin import kafka_client_kwargs

    kw = kafka_client_kwargs(settings.kafka)
    return Client(
        kw.pop("bootstrap_servers"),
        tenant,
        topic_prefix=settings.kafka.topic_prefix,
        http_url=http_url,
        transport="http" if http_url else "kafka",
        timeout_s=timeout_s,
        client_kwargs=kw,
        token=token,
    )


#: an ``--http`` option's value: one URL, none, or those of a repeatable option
HttpValue = str | tuple[str, ...] | None


def http_base(ctx: click.Context, param: click.Parameter, value: HttpValue) -> HttpValue:
    """An ``--http`` option's check: a base URL the client can call (each one of a
    repeatable option), refused before anything runs (`dmem mcp` would otherwise fail
    every tool call on it, `dmem wait` wait its whole timeout)."""
    from dmem.client import check_http_url

    for url in (value,) if isinstance(value, str) else value or ():
        try:
            check_http_url(url)
        except DmemError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


#: seconds a request waits for its answer (search, the MCP tools)
TIMEOUT_OPTION = click.option(
    "--timeout", "timeout_s", type=click.FloatRange(0, min_open=True), default=5.0,
    show_default=True,
)  # fmt: skip


@click.group()
def topics() -> None:
    """Topic administration."""


@topics.command("create")
def topics_create() -> None:
    """Create every dmem topic on the configured broker (idempotent)."""
    from streams.admin import check_broker, ensure_topics

    settings, up = stack_settings()
    try:
        asyncio.run(check_broker(settings.kafka))
        created = asyncio.run(ensure_topics(settings))
    except DmemError as exc:
        fail(exc, no_stack_hint(up))
    click.echo(f"created {len(created)} topics" + (": " + ", ".join(created) if created else ""))


@click.group()
def schemas() -> None:
    """Payload schemas."""


@schemas.command("export")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def schemas_export(directory: Path) -> None:
    """Write the JSON Schema of every payload into DIRECTORY."""
    from schemas import export_json_schemas

    try:
        paths = export_json_schemas(directory)
    except OSError as exc:
        fail(exc)
    for p in paths:
        click.echo(str(p))


@click.command()
@click.argument("query")
@click.option(
    "--tenant", required=True, callback=tenant_name, help="tenant whose memories to search"
)
@click.option("-k", "k", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option(
    "--agent", "agent_id", default=None, callback=ident, help="only this agent's memories"
)
@click.option(
    "--lambda",
    "lam",
    type=click.FloatRange(0, 1),
    default=None,
    help="override the semantic weight",
)
@click.option(
    "--http",
    "http_url",
    default=None,
    callback=http_base,
    help="search over HTTP at this base URL instead of Kafka",
)
@TIMEOUT_OPTION
@click.option(
    "--token",
    envvar="DMEM_API_TOKEN",
    default=None,
    help="API token: the HTTP bearer token, and the credential Kafka requests are signed "
    "with [env DMEM_API_TOKEN]",
)
@click.option("--json", "as_json", is_flag=True, help="print the hits as JSON")
def search(
    query: str,
    tenant: str,
    k: int,
    agent_id: str | None,
    lam: float | None,
    http_url: str | None,
    timeout_s: float,
    token: str | None,
    as_json: bool,
) -> None:
    """Search a running deployment (settings from DMEM_* env vars, else the running
    `dmem up`)."""
    from streams.admin import check_broker

    # --http names the deployment: no running `dmem up` to find
    settings, up = (load_settings(), None) if http_url else stack_settings()

    async def go() -> list[Any]:
        if http_url is None:
            await check_broker(settings.kafka)
        client = deployment_client(settings, tenant, http_url, timeout_s, token)
        async with client:
            return await client.search(query, k, agent_id=agent_id, lambda_=lam)

    try:
        hits = asyncio.run(go())
    except (DmemError, ValidationError) as exc:
        fail(exc, "" if http_url else no_stack_hint(up, http_option=True))
    if as_json:
        click.echo(json.dumps([h.model_dump(mode="json", by_alias=True) for h in hits]))
        return
    if not hits:
        click.echo("no memories found")
    for i, h in enumerate(hits, 1):
        click.echo(
            f"{i}. [{h.partition} v{h.valence:+d} score {h.score:.3f}] {h.text!r} "
            f"-> {h.action} (reward {h.reward:g}, rpe {h.rpe:.2f}, utility {h.utility:.2f})"
        )


@click.command("wait")
@click.option(
    "--settled",
    is_flag=True,
    help="wait until every job has reached its fixed point (no pending work); the one "
    "condition there is, so `dmem wait` alone means the same",
)
@click.option(
    "--http",
    "http_urls",
    multiple=True,
    callback=http_base,
    help="a worker's base URL (repeat for several) [default: DMEM_WEB_HOST:PORT, else the "
    "running `dmem up`'s]",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(0, min_open=True),
    default=120.0,
    show_default=True,
    help="seconds to wait at most",
)
@click.option(
    "--quiet",
    "quiet_s",
    type=click.FloatRange(0),
    default=1.0,
    show_default=True,
    help="settled on every poll for this long",
)
@click.option(
    "--part",
    "parts",
    type=click.Choice(["write", "credit", "maintenance", "access", "history"]),
    multiple=True,
    help="wait for this part of the settle report only (repeat for several; e.g. credit: "
    "reported usage and outcomes applied) [default: every part]",
)
@click.option(
    "--progress/--no-progress",
    default=True,
    show_default=True,
    help="say on stderr every few seconds what it still waits for",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def wait_cmd(
    settled: bool,
    http_urls: tuple[str, ...],
    timeout_s: float,
    quiet_s: float,
    parts: tuple[str, ...],
    progress: bool,
    as_json: bool,
) -> None:
    """Wait until a running deployment has settled: every job at its fixed point, no
    pending work (exit 2 on timeout)."""
    from dmem.wait import wait_settled

    _ = settled
    urls = list(http_urls)  # --http names the workers: no running `dmem up` to find
    if not urls:
        settings, up = stack_settings()
        if up is not None and not ({"DMEM_WEB_HOST", "DMEM_WEB_PORT"} & set(os.environ)):
            urls = [str(up["http"])]  # the running `dmem up`'s worker
        else:
            urls = [f"http://{settings.web_host}:{settings.web_port}"]
    try:
        out = wait_settled(urls, timeout_s=timeout_s, quiet_s=quiet_s,
                           components=list(parts) or None,
                           progress=(lambda line: click.echo(line, err=True)) if progress
                           else None)  # fmt: skip
    except DmemError as exc:
        fail(exc)
    click.echo(json.dumps(out) if as_json else f"settled after {out['waited_s']:.1f} s")


@click.command()
@click.option(
    "--transport", type=click.Choice(["stdio", "http"]), default="stdio", show_default=True
)
@click.option(
    "--tenant",
    required=True,
    envvar="DMEM_MCP_TENANT",
    callback=tenant_name,
    help="the tenant every tool acts for [env DMEM_MCP_TENANT]",
)
@click.option(
    "--agent",
    "agent_id",
    default="mcp",
    show_default=True,
    callback=ident,
    help="agent_id of the transitions `remember` publishes",
)
@click.option(
    "--http",
    "http_url",
    default=None,
    callback=http_base,
    help="the deployment's HTTP API (recall over HTTP; needed by forget and stats)",
)
@click.option(
    "--token",
    envvar="DMEM_API_TOKEN",
    default=None,
    help="the tenant's API token: HTTP bearer token, and the credential that signs every "
    "record sent over Kafka [env DMEM_API_TOKEN]",
)
@TIMEOUT_OPTION
@click.option("--host", default="127.0.0.1", show_default=True, help="http transport only")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=8765,
    show_default=True,
    help="http transport only",
)
@click.option(
    "--auth-token",
    envvar="DMEM_MCP_TOKEN",
    default=None,
    help="bearer token MCP clients must send (http transport) [env DMEM_MCP_TOKEN]",
)
@click.option("--no-auth", is_flag=True, help="serve http without a token (loopback --host only)")
def mcp(
    transport: str,
    tenant: str,
    agent_id: str,
    http_url: str | None,
    token: str | None,
    timeout_s: float,
    host: str,
    port: int,
    auth_token: str | None,
    no_auth: bool,
) -> None:
    """MCP server (tools remember/recall/report_outcome/feedback/forget) for a deployment."""
    try:
        import mcp as _mcp  # noqa: F401  (the extra, imported lazily by build_server)

        from dmem.integrations.mcp import build_server, run_http
    except ImportError as exc:
        raise UsageError(f"{exc}: install the extra: pip install 'dmem[mcp]'") from None
    if transport == "http" and not auth_token and not no_auth:
        raise UsageError(
            "the http transport needs --auth-token (or DMEM_MCP_TOKEN); "
            "--no-auth serves without one"
        )
    if transport == "http" and no_auth:
        from streams.webguard import is_loopback

        if not is_loopback(host):  # no token: only this machine may reach it
            raise UsageError(
                f"--no-auth serves on a loopback address only (127.0.0.1, localhost, ::1), "
                f"not {host!r}: give --auth-token to serve other machines"
            )
    # --http names the deployment (every tool goes over it): no running `dmem up` to find;
    # a running one found serves every tool over its HTTP API (forget and stats need it)
    settings, up = (load_settings(), None) if http_url else stack_settings()
    if up is not None and up.get("http"):
        http_url = str(up["http"])

    def make_client() -> Client:
        return deployment_client(settings, tenant, http_url, timeout_s, token)

    server = build_server(make_client, agent_id=agent_id)
    if transport == "stdio":
        server.run("stdio")
    else:
        run_http(server, host, port, None if no_auth else auth_token)
