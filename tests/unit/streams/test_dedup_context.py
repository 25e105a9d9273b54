"""The dedup job's ANN filter for a merge scope's user metadata (`context_filter`)."""

from types import SimpleNamespace

from operators.dedup import merge_scope
from streams.jobs.dedup import context_filter


def test_context_filter_narrows_by_filterable_user_keys_only() -> None:
    row = {
        "agent_id": "a",
        "action": "go",
        "valence": 1,
        "partition": "core",
        "reward": 2.0,
        "metadata": {
            "user": {
                "task": "melt",
                "variation": 3,
                "gold": True,
                "w": 0.5,
                "tags": ["x"],
                "bad key": "v",
                "nul": "a\x00b",
            }
        },
    }
    ctx = merge_scope(row)[-1]
    # floats (no exact JSON equality), lists, odd keys and NUL strings are left to the
    # row check: the filter only narrows the search
    assert context_filter(ctx) == {
        "metadata.user.task": "melt",
        "metadata.user.variation": 3,
        "metadata.user.gold": True,
    }
    assert context_filter(merge_scope({**row, "metadata": {}})[-1]) == {}


def test_a_scope_no_filter_can_express_is_not_deduplicated_and_not_retried() -> None:
    """A row stored before validation refused it (an action with NUL, a metadata integer
    of -2^63) has a merge scope no Milvus filter can name: the dedup job leaves it
    alone (counted) instead of raising, which the maintenance loop would retry."""
    import numpy as np

    from operators.decay import MaintenancePolicy
    from streams.jobs.dedup import DedupEngine

    def search(*_: object, **__: object) -> None:
        raise AssertionError("no search for a scope without a filter")

    store = SimpleNamespace(client=SimpleNamespace(search=search))
    engine = DedupEngine(store, MaintenancePolicy())  # type: ignore[arg-type]
    vec = np.ones((1, 4), dtype=np.float32)
    nul = ("a", "press\x00enter", 1, "core", False, 1, "")
    huge = ("a", "go", 1, "core", False, 1, '{"k": -9223372036854775808}')
    for scope in (nul, huge):
        assert engine._neighbors("acme", scope, vec, []) == set()  # noqa: SLF001
    assert engine.counters["dedup_scope_unfilterable"] == 2
