"""The dedup job's ANN filter for a merge scope's user metadata (`context_filter`)."""

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
