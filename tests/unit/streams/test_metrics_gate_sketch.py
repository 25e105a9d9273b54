"""``dmem_gate_rpe``'s quantiles describe the tenant's gate over every input partition
the worker holds of it (`streams.metrics.tenant_sketch`), not its lowest one alone."""

from __future__ import annotations

from operators import HashingEncoder
from schemas import Transition, encode
from streams.metrics import tenant_sketch
from streams.settings import Settings
from streams.write.pipeline import RawRecord, WritePipeline


def _feed(p: WritePipeline, partition: int, rewards: list[float], agent: str) -> None:
    ts = [Transition(tenant="t", agent_id=agent, episode_id="e", step=i,
                     observation=f"{agent} at {i}", action="go", reward=r)
          for i, r in enumerate(rewards)]  # fmt: skip
    p.process([RawRecord(encode(t), agent.encode(), "dmem.transitions", partition, i)
               for i, t in enumerate(ts)], now_ms=1)  # fmt: skip


def test_the_quantiles_cover_every_partition_of_the_tenant() -> None:
    p = WritePipeline(Settings(), HashingEncoder(dim=32))
    _feed(p, 0, [0.0] * 300, "quiet")  # the lowest partition: one calm agent
    _feed(p, 3, [(-1.0) ** i * (50.0 if i % 3 == 0 else 0.5) for i in range(300)], "wild")
    low, high = (st.gate_state.sketch for st in p.of_tenant("t"))
    merged = tenant_sketch(p, "t", p.tenants["t"])
    assert merged is not low and merged is not high
    assert merged.count == low.count + high.count
    q99 = merged.quantile(0.99)
    assert low.quantile(0.99) < q99 <= high.quantile(0.99) + 1e-9
    assert low.count == 300 and low.quantile(0.99) == p.tenants["t"].gate_state.sketch.quantile(
        0.99
    )  # the states themselves are left as they were
    assert tenant_sketch(p, "nobody", None) is None
