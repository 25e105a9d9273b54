"""Shared by the integration examples: use a running `dmem up`, or start one here."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # runnable as a plain script from a checkout
    sys.path.insert(0, str(REPO_ROOT))

from streams.local.stack import LocalStack  # noqa: E402


@contextlib.contextmanager
def deployment(kafka: str | None, http: str | None, encoder: str) -> Iterator[tuple[str, str]]:
    """(Kafka bootstrap, HTTP base URL): the given `dmem up`, else an embedded stack."""
    if kafka and http:
        yield kafka, http
        return
    with tempfile.TemporaryDirectory(prefix="dmem-example-") as d:
        print("starting the embedded stack (broker + worker --role all) ...", file=sys.stderr)
        stack = LocalStack(
            Path(d),
            roles=("all",),
            extra_env={"DMEM_ENCODER__NAME": encoder, "DMEM_WRITE__BATCH_WITHIN_S": "0.2"},
        )
        stack.start()
        try:
            assert stack.bootstrap is not None
            yield stack.bootstrap, f"http://127.0.0.1:{stack.web_ports[0]}"
        finally:
            stack.stop()
