"""dmem's benchmark harness, demo and deployment checks (the ``dmem-bench`` distribution
of a checkout; not part of the ``dmem`` wheel).

Its commands (``dmem bench ...``, ``dmem demo``, ``dmem report``, ``dmem deploycheck``)
join the `dmem` CLI through the entry point group ``dmem.cli`` (`dmem_bench.cli`). Each
benchmark lives in its own module and shares the conventions in ``common``: repeats with
medians, progress and a human table on stderr, and exactly one JSON object on the last
stdout line. The CLI imports the modules lazily.
"""

from dmem_bench._version import __version__

__all__ = ["__version__"]
