"""Dedup (jobs role): merge each window of new memories into near-duplicates.

`streams.jobs.scheduler.MaintenanceJob` collects ``written`` events per tenant
until their event time is due (`operators.dedup.EventTimeWindows`: the tenant's
watermark minus the allowed lateness). `DedupEngine.dedup` reads the due rows
(with vectors) and groups them by merge scope (`operators.dedup.merge_scope`:
agent, action, valence, partition, terminal flag, reward sign, user metadata).
Each scope's rows are searched against Milvus (one batched ANN query per scope,
in the scope's partition and reward sign, top ``dedup_k`` excluding the window's
own ids, among the rows with ``created_ts`` up to ``as_of``: the store as of the
window's event time, never rows of later windows that are written and not yet
decided);
rows within cosine ``tau`` whose rewards agree are merged oldest-first
(`plan_merges`, `merge_rows`): the survivor is rewritten, the others deleted,
one ``merged`` event each. The job commits a window's offsets only after its
merges were acknowledged; a replay folds nothing twice (merged ids are
remembered in the survivor). A merged row stays within Milvus' JSON limit
(`merge_rows` keeps the row's byte budget, `schemas.limits`); one the store
refuses all the same is not merged: an error in the log, ``merge_refused`` in
the job's counters, and every row as it was.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from milvus import expr as E
from milvus.schema import VECTOR_FIELD, search_params
from operators.decay import entry_from_row
from operators.dedup import MergeGroup, merge_rows, merge_scope, plan_merges, reward_span
from schemas import MemoryEvent, Partition
from schemas.errors import InvalidRecord
from streams.jobs.index import IndexedEngine
from streams.jobs.rows import WRITE_LOCK, memory_event, unique_rows
from streams.store import upsert_fitting

__all__ = ["DedupEngine", "Scope", "context_filter"]

log = logging.getLogger("dmem.maintenance")

Scope = tuple[str, str, int, str, bool, int, str]  # `operators.dedup.merge_scope`
PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def context_filter(context: str) -> dict[str, Any]:
    """Filter terms for a scope's user metadata (``metadata.user.<key> == value``) for
    the keys the store can filter on exactly: plain-identifier keys with string, int or
    bool values (no float equality on JSON). The rest of the context is checked on
    the rows (`merge_scope`), so a filter term only narrows the ANN search."""
    ctx = json.loads(context) if context else {}
    return {f"metadata.user.{k}": v for k, v in ctx.items()
            if PLAIN_KEY.match(k) and isinstance(v, str | int | bool)
            and not (isinstance(v, str) and "\x00" in v)}  # fmt: skip


class DedupEngine(IndexedEngine):
    """Dedup windows over the index (sync, runs in a worker thread)."""

    def _neighbors(self, tenant: str, scope: Scope, vectors: np.ndarray,
                   exclude: list[str], as_of: int | None = None) -> set[str]:  # fmt: skip
        """Ids of stored rows in `scope`'s partition and reward sign within tau of any
        of `vectors`, created at or before `as_of` (batched ANN; the rest of the scope
        is checked on the rows)."""
        agent, action, valence, part, _done, sign, context = scope
        reward = {"==": 0.0} if sign == 0 else ({">": 0.0} if sign > 0 else {"<": 0.0})
        bounded = {"created_ts": {"<=": int(as_of)}} if as_of is not None else {}
        try:
            flt = E.build_filter(tenant=tenant, agent_id=agent, extra_filter={
                "action": action, "valence": valence, "reward": reward,
                **context_filter(context), **bounded})  # fmt: skip
        except InvalidRecord as exc:  # a scope no filter can express: not deduplicated,
            log.warning("dedup of %s/%s skipped: %s", tenant, agent, exc)  # not retried
            self._count("dedup_scope_unfilterable")
            return set()
        if exclude:
            flt = E.and_all([flt, f"not ({self.store.key_filter(tenant, exclude)})"])
        client = self.store.client
        params = search_params(self.store.is_lite, self.dedup_k)
        found: set[str] = set()
        for i in range(0, len(vectors), 256):
            chunk = [v.tolist() for v in vectors[i : i + 256]]
            with self.store._errors("dedup search"):  # noqa: SLF001 - same error mapping
                res = client.search(
                    self.store.collection,
                    data=chunk,
                    filter=flt,
                    limit=self.dedup_k,
                    output_fields=["id"],
                    search_params=params,
                    partition_names=[part],
                    anns_field=VECTOR_FIELD,
                    timeout=self.store.timeout_s,
                    consistency_level="Strong",
                )
            for hits in res or []:
                for h in hits:
                    if float(h["distance"]) >= self.policy.tau - 1e-6:
                        # the hit's own "id" is the storage key: the memory id is a field
                        found.add(str((h.get("entity") or {})["id"]))
        return found

    def dedup(self, tenant: str, ids: Sequence[str], now: int,
              as_of: int | None = None) -> list[MemoryEvent]:  # fmt: skip
        """Merge one tenant's window of new memories into existing ones (and each other).

        `as_of` (event time): only stored rows created at or before it are candidates
        (None: every stored row); `now` only stamps the events."""
        rows = {k: r for k, r in unique_rows(self.store.get(list(ids), tenant=tenant,
                                                        with_vector=True)).items()
                if r.get("tenant") == tenant}  # fmt: skip
        scopes: dict[Scope, list[str]] = {}
        for mid, r in rows.items():
            scopes.setdefault(merge_scope(r), []).append(mid)
        t = self.index.tenant(tenant)
        events: list[MemoryEvent] = []
        for scope, sids in scopes.items():
            vecs = np.stack([np.asarray(rows[m][VECTOR_FIELD], dtype=np.float32) for m in sids])
            near = self._neighbors(tenant, scope, vecs, sids, as_of) - set(sids)
            group_rows = {m: rows[m] for m in sids}
            if near:
                for mid, r in unique_rows(
                    self.store.get(sorted(near), tenant=tenant, with_vector=True)
                ).items():
                    if r.get("tenant") == tenant and merge_scope(r) == scope:
                        group_rows[mid] = r
            order = sorted(group_rows)
            groups = plan_merges(
                order,
                [int(group_rows[m]["created_ts"]) for m in order],
                np.stack(
                    [np.asarray(group_rows[m][VECTOR_FIELD], dtype=np.float32) for m in order]
                ),  # fmt: skip
                self.policy.tau,
                [reward_span(group_rows[m]) for m in order],
                self.policy.reward_tol,
            )
            merged: set[str] = set()
            for g in groups:
                applied = self._apply_merge(g, group_rows, now)
                if applied is None:
                    continue  # refused: every row stays as it is
                events += applied
                merged.update(g.members)
            for mid, r in group_rows.items():
                if mid not in merged and mid in rows:
                    t.upsert(mid, entry_from_row(r))
        for mid in ids:
            if mid not in rows:
                t.remove(mid)
        return events

    def _apply_merge(self, g: MergeGroup, rows: dict[str, dict[str, Any]],
                     now: int) -> list[MemoryEvent] | None:  # fmt: skip
        """Fold `g`'s members into its survivor: the survivor is rewritten, then the
        members deleted; returns the events. None: nothing merged, because the survivor
        or every member is no longer stored (a later pass sees the rows as they are), or
        the store refuses the merged row by itself (`InvalidRecord`, e.g. its metadata
        over Milvus' JSON limit, which `merge_rows`' byte budget rules out for rows dmem
        built): logged as an error and counted (``merge_refused``), nothing written or
        deleted, so the job goes on and no memory is lost."""
        with WRITE_LOCK:
            # the rows as they are now, under the lock: credit or access counts written
            # since the window was read are folded, not overwritten
            now_rows = unique_rows(self.store.get([g.survivor, *g.members],
                                                  tenant=str(rows[g.survivor]["tenant"]),
                                                  with_vector=True))  # fmt: skip
            # a row gone since the window was read (forgotten, evicted, folded elsewhere)
            # is not merged from the copy read then: that would write it back
            ids = [m for m in g.members if m in now_rows]
            sims = [sim for m, sim in zip(g.members, g.similarity, strict=True) if m in now_rows]
            if g.survivor not in now_rows or not ids:
                return None
            s = {**rows[g.survivor], **now_rows[g.survivor]}
            members = [{**rows[m], **now_rows[m]} for m in ids]
            new, folded = merge_rows(s, members)
            target = str(new.pop("partition"))
            if folded or target != s["partition"]:
                clean = {k: v for k, v in new.items() if k not in ("distance", "similarity")}
                refused = upsert_fitting(self.store, [clean], cast(Partition, target))
                if refused:
                    log.error("merge of %s into %s refused: %s", list(g.members), g.survivor,
                              "; ".join(refused.values()))  # fmt: skip
                    self._count("merge_refused")
                    return None
            # the fold index first: a folded id is always either stored or folded
            self.store.history.fold(
                str(s["tenant"]), dict.fromkeys(ids, g.survivor), now,
                {str(m["id"]): f"into {g.survivor} cos={sim:.4f}"
                 for m, sim in zip(members, sims, strict=True)},
            )  # fmt: skip
            self.store.delete(ids, tenant=str(s["tenant"]))
        t = self.index.tenant(str(s["tenant"]))
        events = []
        for m, sim in zip(members, sims, strict=True):
            t.remove(str(m["id"]))
            events.append(
                memory_event("merged", m, m["partition"], f"into {g.survivor} cos={sim:.4f}", now)
            )
        t.upsert(g.survivor, entry_from_row({**new, "partition": target}))
        self._count("merged", len(members))
        if target != s["partition"]:
            events.append(
                memory_event("promoted", s, target, "merge: a core duplicate joined", now)
            )
            self._count("promoted")
        return events
