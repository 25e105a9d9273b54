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
