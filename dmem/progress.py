"""A progress indicator on stderr for long CLI commands (`dmem import`, the benches)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Progress on stderr: an updating bar on a terminal, a few lines otherwise."""

    def __init__(
        self, label: str, total: int, out: TextIO | None = None, every_frac: float = 0.1
    ) -> None:
        self.label, self.total = label, max(int(total), 1)
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self.t0 = time.monotonic()
        self.every = max(1, int(self.total * every_frac))
        self._next = self.every
        self._done = False

    def update(self, done: int, extra: str = "") -> None:
        if self._done:
            return
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        rate = done / elapsed
        line = f"{self.label}: {done:,}/{self.total:,} ({rate:,.0f}/s) {extra}".rstrip()
        if self.tty:
            frac = min(done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            self.out.write(f"\r  [{bar:<30}] {line}   ")
            if done >= self.total:
                self.out.write("\n")
            self.out.flush()
        elif done >= self._next or done >= self.total:
            self.out.write(f"  {line}\n")
            self.out.flush()
            while self._next <= done:
                self._next += self.every
        if done >= self.total:
            self._done = True
