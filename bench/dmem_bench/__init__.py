"""`dmem bench ...`: long-running benchmarks (not run in CI).

Each benchmark lives in its own module (``retrieval`` now; ``write``, ``credit``,
``maintenance``, ``chaos`` later) and shares the conventions in ``common``:
repeats with medians, progress and a human table on stderr, and exactly one
JSON object on the last stdout line. Modules are imported lazily by the CLI.
"""
