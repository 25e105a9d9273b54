"""The jobs role and the tools around stored memories.

- `credit`: outcome credit (credit job, utility applier);
- `scheduler`: the maintenance job, over `index`, `dedup` and `decay` (shared row
  helpers in `rows`);
- `access`: access tracking, run by the respond role;
- `forget` and `inspection`: ``dmem forget`` / ``POST /v1/forget`` and ``dmem inspect``.
"""
