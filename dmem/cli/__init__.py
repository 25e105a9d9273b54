"""The `dmem` command line.

The client commands (``search``, ``wait``, ``schemas``, ``topics``, ``mcp``) need only
the core install; the server commands (``worker``, ``up``, ``import``, ``migrate``,
``inspect``, ``forget``) import the stream processor when they run and, without the
``server`` extra, say what to install. Other distributions add commands through the
entry point group ``dmem.cli`` (the benchmark harness of a checkout adds ``bench``,
``demo``, ``report`` and ``deploycheck``).

Errors are one line on stderr and a non-zero exit (2 for bad settings or an
unreachable service), never a traceback wall; ``DMEM_DEBUG=1`` shows tracebacks.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import click

from dmem.cli import client, server
from dmem.cli.common import UsageError

__all__ = ["ENTRY_POINT_GROUP", "main"]

#: entry point group whose click commands join the `dmem` group
ENTRY_POINT_GROUP = "dmem.cli"
#: commands of the benchmark harness, which runs from a checkout
HARNESS_COMMANDS = ("bench", "demo", "report", "deploycheck")


def _harness_missing(name: str) -> click.Command:
    def callback(**_: Any) -> None:
        raise UsageError(
            f"`dmem {name}` is part of the benchmark harness, which runs from a checkout "
            "of the repository: pip install -e ./bench"
        )

    return click.Command(
        name,
        callback=callback,
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


class _Main(click.Group):
    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None and cmd_name in HARNESS_COMMANDS:
            return _harness_missing(cmd_name)
        return cmd


@click.group(cls=_Main)
def main() -> None:
    """dmem: dopamine-gated, outcome-credited memory for agents, over Kafka and Milvus."""


for _cmd in (
    client.topics,
    client.schemas,
    client.search,
    client.wait_cmd,
    client.mcp,
    server.worker,
    server.up,
    server.import_cmd,
    server.migrate,
    server.inspect_cmd,
    server.forget,
):
    main.add_command(_cmd)


def _add_plugins(group: click.Group) -> None:
    """Commands that installed distributions declare under ``dmem.cli``."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            cmd = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plug-in must not break the CLI
            click.echo(
                f"dmem: warning: command {ep.name!r} ({ep.value}) did not load: {exc}", err=True
            )
            continue
        group.add_command(cmd, ep.name)


_add_plugins(main)
