"""Run one worker process of the stream processor: ``python -m streams.worker --role R``.

The processor's own entry point, so `streams` never needs the `dmem` CLI above it
(the local stack starts its workers through this module; ``dmem worker`` calls
`run_worker`). Settings come from ``DMEM_*`` variables only. A bad setting or an
unreachable service is one line on stderr and exit code 2, like the CLI's errors.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from pydantic import ValidationError
from pydantic_settings import SettingsError

from schemas.errors import DmemError
from streams.app import ROLES
from streams.settings import Settings, setting_error


def run_worker(settings: Settings, role: str) -> None:
    """Check the broker, create the topics, build the app and run it until stopped.

    Raises `DmemError` (e.g. `BrokerUnavailable`) before the worker starts.
    """
    import faust

    from streams.admin import check_broker, ensure_topics
    from streams.app import build_app
    from streams.codec import register

    asyncio.run(check_broker(settings.kafka))
    asyncio.run(ensure_topics(settings))
    register()
    app = build_app(settings, role)
    w = faust.Worker(app, loglevel=settings.log_level, quiet=True, redirect_stdouts=False)
    # No startup spinner: for it faust sets the ROOT logger to DEBUG (at any loglevel
    # >= warn) and keeps a DEBUG handler, so every library debug call (aiokafka logs
    # several per fetch and send) builds and handles a LogRecord for nothing, a
    # noticeable share of the respond worker's CPU under load.
    w.spinner = None
    w.execute_from_commandline()


def settings_or_exit() -> Settings:
    """Settings from the environment, or one ``dmem: error: bad setting ...`` line and exit 2."""
    try:
        return Settings()
    except (ValidationError, SettingsError) as exc:
        fail(setting_error(exc))
        raise  # unreachable: fail exits


def fail(message: object) -> None:
    print(f"dmem: error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m streams.worker")
    parser.add_argument("--role", choices=ROLES, default="all")
    args = parser.parse_args(argv)
    settings = settings_or_exit()
    try:
        run_worker(settings, args.role)
    except DmemError as exc:
        if os.environ.get("DMEM_DEBUG"):
            raise
        fail(exc)


if __name__ == "__main__":
    main()
