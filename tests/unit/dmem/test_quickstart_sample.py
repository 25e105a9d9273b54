"""The quickstart's sample of `dmem up`'s first screen is what `dmem up` prints."""

from __future__ import annotations

import re
from pathlib import Path

from streams.local.stack import first_screen

ROOT = Path(__file__).resolve().parents[3]


def test_the_quickstart_shows_dmem_ups_first_screen_with_its_default_data_dir() -> None:
    """Its addresses, and the default --data-dir as `dmem up` resolves it, run from
    /home/me."""
    from dmem.cli.server import up

    (default,) = (p.default for p in up.params if p.name == "data_dir")
    sample = re.search(r"```text\n(dmem is up\n.*?)\n```",
                       (ROOT / "docs" / "quickstart.md").read_text(), re.S)  # fmt: skip
    assert sample is not None
    info = {"kafka": "127.0.0.1:41235", "http": "http://127.0.0.1:45121",
            "milvus": "http://127.0.0.1:38547", "milvus_mode": "server",
            "milvus_loopback": True, "ui": "http://127.0.0.1:45121/ui/",
            "auth": "off (no DMEM_AUTH__TOKENS set: any local process may read and write "
                    "every tenant)",
            "data_dir": str(Path("/home/me") / str(default))}  # fmt: skip
    assert sample.group(1) == first_screen(info)
