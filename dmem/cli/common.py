"""What every `dmem` command shares: settings from the environment, one-line errors,
and the message for a server command run without the server's packages."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any, NoReturn

import click
from pydantic import ValidationError
from pydantic_settings import SettingsError

if TYPE_CHECKING:
    from streams.settings import Settings

__all__ = [
    "DEPLOYMENT_SETTINGS",
    "UsageError",
    "fail",
    "ident",
    "load_settings",
    "named_deployment",
    "no_stack_hint",
    "server_imports",
    "settings_with",
    "stack_settings",
    "check_signing",
    "tenant_name",
    "up_settings",
]


#: how every dmem error line starts (on stderr)
ERROR_PREFIX = "dmem: error: "


class UsageError(click.ClickException):
    """A bad setting or a missing extra: one line on stderr, exit status 2, with the
    prefix of every other dmem error (`fail`)."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"{ERROR_PREFIX}{self.format_message()}", file=file, err=True)


def load_settings(**overrides: Any) -> Settings:
    """`streams.settings.Settings` from DMEM_* variables; a bad value is a usage error."""
    from streams.settings import Settings, setting_error

    try:
        return Settings(**overrides)
    except (ValidationError, SettingsError) as exc:
        raise UsageError(setting_error(exc)) from None


def settings_with(env: dict[str, str]) -> Settings:
    """`load_settings` as if ``env`` were added to the environment."""
    saved = dict(os.environ)
    try:
        os.environ.update(env)
        return load_settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)


#: DMEM_* settings that name a deployment. With one of them set a command talks to the
#: deployment the settings and defaults describe, and no running `dmem up` fills in the
#: rest: the stack's broker beside a Milvus named here would make `dmem forget` delete
#: from one deployment and send its forget events to the other. (``DMEM_WEB_HOST`` and
#: ``DMEM_WEB_PORT`` name only the worker `dmem wait` polls, which uses nothing else.)
DEPLOYMENT_SETTINGS = ("DMEM_KAFKA__BROKER", "DMEM_MILVUS__URI")


def named_deployment() -> str | None:
    """The first of `DEPLOYMENT_SETTINGS` set in the environment (non-empty), else None."""
    return next((k for k in DEPLOYMENT_SETTINGS if os.environ.get(k)), None)


def up_settings(state: dict[str, Any]) -> Settings:
    """Settings pointing at the announced `dmem up` ``state``; a DMEM_* variable set
    (the topic prefix, the app id, ...) wins over the stack's value."""
    from streams.local.announce import client_env

    return settings_with({k: v for k, v in client_env(state).items() if k not in os.environ})


def stack_settings() -> tuple[Settings, dict[str, Any] | None]:
    """Settings of a command that talks to a deployment, and the `dmem up` they found.

    DMEM_* as given; where none of them names a deployment (`named_deployment`), the
    running `dmem up` this machine announced (`streams.local.announce`) fills in what they
    leave unset (`up_settings`): the one on ``DMEM_DATA_DIR`` when that is set, else the
    only one running (a `UsageError` lists them when several run). Nothing found: the
    settings as given."""
    from schemas.errors import ConfigError
    from streams.local.announce import STATE_NAME, read_state, the_running

    settings = load_settings()
    if named_deployment():
        return settings, None
    if os.environ.get("DMEM_DATA_DIR"):
        state = read_state(settings.data_dir / STATE_NAME)
    else:
        try:
            state = the_running(settings.runtime_dir, "DMEM_DATA_DIR={}")
        except ConfigError as exc:  # several: the user picks one (a bad setting, exit 2)
            raise UsageError(one_line(exc)) from None
    if state is None:
        return settings, None
    return up_settings(state), state


#: what a user may do instead of a command that signs for the service
_UNSIGNED_ALTERNATIVE = {
    "forget": "; or forget over HTTP with a token (DELETE /v1/memories/{id}?tenant=T)",
    "import": "; or publish with the SDK and a tenant's token (DMEM_API_TOKEN)",
}


def check_signing(settings: Settings, up: dict[str, Any] | None, command: str) -> None:
    """`UsageError` before ``dmem <command>`` acts, where the `dmem up` it found checks
    record credentials and this shell's settings would not sign its records with the
    stack's service key: the workers would refuse them as ``unauthenticated`` dead
    letters while the command reported success (a forget without its tombstone, an
    import that stored nothing). A deployment that is no `dmem up` announces no key:
    its operator runs the command with the deployment's ``DMEM_AUTH__*``."""
    want = (up or {}).get("service_key_id")
    if not want:
        return
    from streams.auth import service_key_id

    have = service_key_id(settings)
    if have == want:
        return
    why = ("this shell's DMEM_AUTH__* settings sign no records" if have is None
           else "this shell's DMEM_AUTH__* settings give another key")  # fmt: skip
    raise UsageError(
        f"the running `dmem up` (pid {(up or {}).get('pid')}) checks record credentials: "
        f"`dmem {command}` signs its records with the service's key, and {why}, so its "
        "workers would refuse them; run it with the DMEM_AUTH__TOKENS (or __TOKENS_FILE, "
        f"__SERVICE_SECRET) the stack was started with{_UNSIGNED_ALTERNATIVE.get(command, '')}"
    )


def fail(exc: BaseException, hint: str = "") -> NoReturn:
    """One line on stderr and exit status 2 (``DMEM_DEBUG=1``: the traceback instead);
    ``hint`` is added where the error is a deployment out of reach (`no_stack_hint`)."""
    if os.environ.get("DMEM_DEBUG"):
        raise exc
    from schemas.errors import ServiceUnavailable

    tail = hint if isinstance(exc, ServiceUnavailable) else ""
    click.echo(f"{ERROR_PREFIX}{one_line(exc)}{tail}", err=True)
    sys.exit(2)


def no_stack_hint(up: dict[str, Any] | None, http_option: bool = False) -> str:
    """What to do when the default deployment is out of reach and no `dmem up` runs
    (`stack_settings` found none and no DMEM_* variable names a deployment); ""
    otherwise: a named or found deployment's own error says enough. ``http_option``:
    the command also takes ``--http`` (a worker's URL)."""
    if up is not None or named_deployment():
        return ""
    http = "; --http for a worker" if http_option else ""
    return ("; no running `dmem up` was found: start one (`dmem up`), or name the "
            f"deployment (DMEM_KAFKA__BROKER, DMEM_MILVUS__URI{http})")  # fmt: skip


def one_line(exc: BaseException) -> str:
    """The error as one line: a validation error as ``field: reason; ...``."""
    cause = exc if isinstance(exc, ValidationError) else exc.__cause__
    if isinstance(cause, ValidationError):
        reasons = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'input'}: {e['msg']}" for e in cause.errors()
        )
        head = "" if cause is exc else str(exc).split(":", 1)[0] + ": "
        return head + reasons
    return " ".join(str(exc).split())


def tenant_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A ``--tenant`` (or ``--agent``, ``--memory``) option's check: a name every payload
    accepts (`schemas.models.Ident`), refused before anything runs (a forget or an
    inspect of a name no write can have used would answer 0 and exit 0; an empty
    ``--agent ""`` would narrow nothing, so ``dmem forget`` would delete the whole
    tenant)."""
    from schemas.limits import LIMITS
    from schemas.models import IDENT_PATTERN, is_ident

    if value is not None and not is_ident(value):
        raise click.BadParameter(f"must match {IDENT_PATTERN} (at most {LIMITS.max_id_chars} "
                                 "characters)")  # fmt: skip
    return value


#: the same check for an agent or memory id option
ident = tenant_name


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
