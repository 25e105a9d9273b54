"""Credit and dedup both rewrite rows (Milvus has no partial update): a credit applied
after a merge planned its survivor is folded into the survivor, not overwritten by the
merge's copy of the row read before it (real Milvus)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest

from milvus import MemoryStore
from operators.decay import MaintenancePolicy
from operators.dedup import MergeGroup
from schemas import UtilityUpdate
from streams.jobs.credit import UtilityApplier
from streams.jobs.scheduler import MaintenanceEngine
from streams.settings import Settings
from tests.integration.milvus_fixtures import make_record, unit_vector

pytestmark = pytest.mark.integration
NOW = 1_800_000_000_000


def test_a_credit_between_a_merges_read_and_write_is_kept(
    store_factory: Callable[..., MemoryStore],
) -> None:
    store = store_factory(dim=8)
    base = unit_vector(8, 3)
    store.upsert([make_record(f"r{i}", vector=base, reward=1.0, created_ts=100 + i)
                  for i in range(2)], "core")  # fmt: skip
    eng = MaintenanceEngine(store, MaintenancePolicy(tau=0.95))
    eng.bootstrap()
    # the window as the dedup pass read it, before the credit landed
    read = {r["id"]: r for r in store.get(["r0", "r1"], tenant="acme", with_vector=True)}
    applier = UtilityApplier(Settings(), SimpleNamespace(store=store))
    up = UtilityUpdate(update_id="u1", memory_id="r0", tenant="acme", credit=1.0, ts=NOW)
    assert applier.apply([up]) == 1
    eng._apply_merge(MergeGroup("r0", ("r1",), (1.0,)), read, NOW)  # noqa: SLF001
    (row,) = store.get(["r0"], tenant="acme")
    assert row["merged_count"] == 2 and row["uses"] == 1
    assert row["utility"] == pytest.approx(1.0)
    assert row["metadata"]["credit"]["n"] == 1 and row["metadata"]["credit_ids"] == ["u1"]
    assert not store.get(["r1"], tenant="acme")
