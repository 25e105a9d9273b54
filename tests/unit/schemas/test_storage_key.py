"""The storage key folds the tenant into the primary key without collisions (issue 21)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import Transition, storage_key

IDENT = st.from_regex(r"[A-Za-z0-9_.:@/-]{1,24}", fullmatch=True)


@given(IDENT, IDENT, IDENT, IDENT)
def test_keys_equal_only_for_equal_pairs(t1: str, i1: str, t2: str, i2: str) -> None:
    assert (storage_key(t1, i1) == storage_key(t2, i2)) == ((t1, i1) == (t2, i2))


@given(IDENT, IDENT)
def test_key_fits_the_models_limits(tenant: str, mid: str) -> None:
    # every tenant and memory id a Transition accepts has a key (no "|" in a tenant)
    t = Transition(
        tenant=tenant,
        agent_id="a",
        episode_id="e",
        step=0,
        observation="x",
        action="a",
        transition_id=mid,
    )
    key = storage_key(t.tenant, t.memory_id)
    assert key.startswith(tenant + "|") and key.endswith("|" + mid)


def test_tenant_with_separator_or_empty_parts_refused() -> None:
    for tenant, mid in (("a|b", "c"), ("", "c"), ("a", "")):
        with pytest.raises(ValueError):
            storage_key(tenant, mid)
    # a memory id may hold the separator: the tenant (which cannot) still ends at the first "|"
    assert storage_key("a", "b|c").split("|", 1) == ["a", "b|c"]
