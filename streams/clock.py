"""The processing-time clock, written once.

Processing time only decides *when* a job runs or how long a request waited; what a
job decides is measured on event time. Operators never read a
clock: callers pass ``now`` in from here.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return int(time.time() * 1000)
