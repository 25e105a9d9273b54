"""What every `dmem` command shares: settings from the environment, one-line errors,
and the message for a server command run without the server's packages."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import click
from pydantic import ValidationError
from pydantic_settings import SettingsError

if TYPE_CHECKING:
    from streams.settings import Settings

__all__ = ["UsageError", "fail", "load_settings", "server_imports"]


class UsageError(click.ClickException):
    """A bad setting or a missing extra: one line on stderr, exit status 2."""

    exit_code = 2


def load_settings(**overrides: Any) -> Settings:
    """`streams.settings.Settings` from DMEM_* variables; a bad value is a usage error."""
    from streams.settings import Settings, setting_error

    try:
        return Settings(**overrides)
    except (ValidationError, SettingsError) as exc:
        raise UsageError(setting_error(exc)) from None


def fail(exc: BaseException) -> NoReturn:
    """One line on stderr and exit status 2 (``DMEM_DEBUG=1``: the traceback instead)."""
    if os.environ.get("DMEM_DEBUG"):
        raise exc
    click.echo(f"dmem: error: {exc}", err=True)
    sys.exit(2)


@contextmanager
def server_imports(command: str) -> Iterator[None]:
    """Around the lazy imports of a command that runs the stream processor: without the
    ``server`` extra (torch, faust, pymilvus, ...) it says what to install."""
    try:
        yield
    except ModuleNotFoundError as exc:
        raise UsageError(
            f"`dmem {command}` needs `pip install 'dmem[server]'` "
            f"(module {exc.name!r} is not installed)"
        ) from None
