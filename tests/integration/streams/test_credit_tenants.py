"""The utility applier on real Milvus: an update reaches its own tenant's row only (issue 21)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest

from milvus import MemoryStore
from schemas import UtilityUpdate
from streams.jobs.credit import UtilityApplier
from streams.settings import Settings
from tests.integration.milvus_fixtures import make_record

pytestmark = pytest.mark.integration


def test_credit_for_a_shared_id_reaches_only_its_tenant(
    store_factory: Callable[..., MemoryStore],
) -> None:
    store = store_factory(dim=8)
    store.upsert([make_record(m, tenant="alpha", utility=0.5) for m in ("shared", "only-a")],
                 "core")  # fmt: skip
    store.upsert([make_record("shared", tenant="beta", utility=0.0)], "buffer")

    def rows(tenant: str) -> dict[str, dict]:
        got = store.get(["shared", "only-a"], tenant=tenant, with_vector=True)
        return {r["id"]: {**r, "vector": r["vector"].tobytes()} for r in got}

    alpha_before = rows("alpha")
    applier = UtilityApplier(Settings(), SimpleNamespace(store=store))
    ups = [UtilityUpdate(update_id=f"u{i}", memory_id=mid, tenant="beta", credit=-1.0, ts=1)
           for i, mid in enumerate(["shared", "only-a", "shared"])]  # fmt: skip
    assert applier.apply(ups) == 1  # beta's own "shared" row; "only-a" is alpha's only
    assert applier.skipped == 1 and applier.applied == 2
    assert rows("alpha") == alpha_before
    (b,) = rows("beta").values()
    # two blames fold into beta's row's statistics (alpha's untouched, checked above)
    assert b["metadata"]["credit"]["n"] == 2 and b["utility"] == pytest.approx(-1.0)
    assert b["uses"] == 2 and b["partition"] == "buffer"


def test_applier_reports_the_rows_it_changed_by_tenant_and_id(
    store_factory: Callable[..., MemoryStore],
) -> None:
    """The maintenance job re-reads the (tenant, id)s the applier names; it once got
    (tenant, (tenant, id)) pairs, and every decay pass after a credit failed on them.
    An update without evidence adds uses and leaves the utility where it was."""
    store = store_factory(dim=8)
    store.upsert([make_record(m, tenant="alpha", utility=0.5) for m in ("a", "b")], "core")
    applier = UtilityApplier(Settings(), SimpleNamespace(store=store))
    seen: list[list[tuple[str, str]]] = []
    applier.on_applied = seen.append
    ups = [UtilityUpdate(update_id="u1", memory_id="a", tenant="alpha", credit=1.0, ts=1),
           UtilityUpdate(update_id="u2", memory_id="b", tenant="alpha", credit=0.0, uses=3,
                         ts=1, evidence=False)]  # fmt: skip
    assert applier.apply(ups) == 2
    assert seen == [[("alpha", "a"), ("alpha", "b")]]
    got = {r["id"]: r for r in store.get(["a", "b"], tenant="alpha")}
    # a's first acted-on credit is its statistics' mean; b has no evidence: no statistics
    assert got["a"]["utility"] == pytest.approx(1.0) and got["a"]["uses"] == 1
    assert got["a"]["metadata"]["credit"]["n"] == 1
    assert got["b"]["utility"] == pytest.approx(0.5) and got["b"]["uses"] == 3
    assert "credit" not in (got["b"]["metadata"] or {})
