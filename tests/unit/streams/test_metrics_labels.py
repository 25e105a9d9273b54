"""The ``tenant`` label of ``/metrics`` (`streams.metrics.tenant_label`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

from streams.metrics import TENANT_LABELS, _ByTenant, tenant_label
from streams.settings import Settings


def test_modes() -> None:
    h = tenant_label("acme", "hash")
    assert h.startswith("t-") and len(h) == 14 and "acme" not in h
    assert h == tenant_label("acme", "hash") != tenant_label("acme2", "hash")
    assert tenant_label("acme", "name") == "acme"
    assert tenant_label("acme", "none") == "*"
    assert Settings().metrics_tenant_labels == "hash"  # the default names no tenant


def test_labelled_metrics_never_carry_the_id_by_default() -> None:
    reg = CollectorRegistry()
    c = _ByTenant(Counter("x", "x", ["tenant"], registry=reg))
    saved = TENANT_LABELS[0]
    try:
        TENANT_LABELS[0] = "hash"
        c.labels(tenant="secret-customer").inc()
        text = generate_latest(reg).decode()
        assert "secret-customer" not in text and tenant_label("secret-customer", "hash") in text
        TENANT_LABELS[0] = "name"
        c.labels(tenant="visible").inc()
        assert 'tenant="visible"' in generate_latest(reg).decode()
    finally:
        TENANT_LABELS[0] = saved


def test_a_dead_letter_of_any_role_is_counted_by_its_category() -> None:
    from streams.auth import UNAUTHENTICATED
    from streams.metrics import DEAD_LETTERS, count_dead_letter, reason_category
    from streams.write.pipeline import RawRecord, dead_letter

    assert reason_category(UNAUTHENTICATED) == "unauthenticated"
    raw = RawRecord(b"{}", b"k", "dmem.retrieval.requests", 0, 7)
    counter = DEAD_LETTERS.labels(reason="unauthenticated")
    before = counter._value.get()  # noqa: SLF001
    count_dead_letter(dead_letter(raw, UNAUTHENTICATED, "Unauthenticated", "respond", 1))
    assert counter._value.get() == before + 1  # noqa: SLF001
