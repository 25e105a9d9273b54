"""The write path as one plain object: raw records in, routed memories out.

No faust and no Milvus here: the write role's consumer (`streams.write.consumer`)
feeds batches of raw Kafka records and writes what comes back. Time is an
argument (`now_ms`).

Per batch: decode + validate (bad records become `DeadLetter`s with a reason) ->
encode observations and next observations in one call -> per tenant: TD errors
from the value model *before* it learns from the batch, then one TD update ->
normalise delta by the tenant's running sigma -> smooth per agent -> gate.

Decisions:
- ``rpe`` is the tenant-normalised delta z (scale free, so thresholds and
  ranking work across tenants); ``rpe_smoothed`` is the gate score s;
  ``valence`` is sign(delta). Where the reward-free surprise term
  (`operators.surprise`, ``max(s_ext, w * s_int)``) routed a transition, ``rpe``
  is that score, so decay and ranking see the surprise that kept it.
- Exact repeats (``gate.drop_exact_repeats``; same tenant, agent, observation,
  action, reward, metadata) of a transition already stored are dropped with reason
  ``repeat``; near-duplicates are the dedup job's business.
- A reward-free statement that is new for its agent (no near-repeat) and that the
  gate would drop goes to the buffer (reason ``novel_statement``) in a tenant that
  reports episode outcomes (``gate.keep_novel_statements``): the gate ranks a
  reward-free tenant on TD noise, and a briefing credit could prove decisive must
  be stored to be credited (credit then promotes it to core). Tenants without
  outcomes (chats) are judged as before.
- A late outcome re-scores its episode (hindsight, `WritePipeline.rescore`); one that
  is a failure for its (agent, task) also keeps the terminal steps of an episode that
  ended without a negative reward (buffer, reason ``failure_terminal``): a death that
  paid 0 is otherwise invisible to the gate and to hindsight (`operators.failure`).
- State (everything in `TenantState`) is kept per (tenant, input partition) and
  snapshotted to the compacted ``models`` topic under `state_key`: transitions
  are keyed by agent, so a partition holds whole agents and a rebalance hands
  their state over whole, as Kafka Streams does with its tasks.
- A (tenant, partition) seen for the first time is seeded from a per-tenant
  checkpoint (`seed`) or copied from another partition of the same tenant,
  never judged by a cold state when a warm one exists.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import orjson
from pydantic import ValidationError

from operators import (
    AgentSmoother,
    DecayedQuantileSketch,
    EligibilityEntry,
    EligibilityWindow,
    Encoder,
    Gate,
    GateDecision,
    GateState,
    OutcomeHistory,
    PassthroughEncoder,
    RewardSurprise,
    RpeNormalizer,
    TDValueLearner,
    extrinsic_score,
    valence,
)
from operators.failure import ContextOutcomes
from operators.surprise import (
    IntrinsicConfig,
    IntrinsicScore,
    IntrinsicState,
    RndSurprise,
    gate_score,
    guard_calibration,
)
from schemas import LIMITS, DeadLetter, MemoryEvent, Partition, Transition
from schemas.models import KEY_SEP, final_outcome_id
from streams.auth import UNAUTHENTICATED, KafkaGuard
from streams.settings import Settings

STATE_FORMAT = 1
#: the unit of the TD errors a checkpoint's RPE scale, sigmas and eligibility deltas are
#: in: reward units. A checkpoint without it holds them in the value model's reward stds
#: and is converted on load (`TenantState.from_bytes`)
RPE_UNIT = "reward"
MAX_REPEAT_KEYS = 50_000
# Checkpoints stay well under a Kafka message limit: the most recent content keys
# only, and the eligibility windows (with their dropped transitions and the scale
# hindsight re-scores them with) of the most recently written episodes only: a
# restart forgets older open episodes, which only affects their hindsight writes.
CHECKPOINT_REPEAT_KEYS = 10_000
CHECKPOINT_EPISODES = 32
#: the dropped transitions of those episodes a checkpoint holds, newest first, as JSON:
#: 64 steps of 32 episodes at the text limits would be ~100 MB, over any message limit
#: (the write producer's is 8 MiB); the rest lose their hindsight writes on a restart
CHECKPOINT_RECENT_BYTES = 4 * 1024 * 1024
#: (agent, task) contexts whose recent outcomes a checkpoint holds (failure judgement)
CHECKPOINT_CONTEXTS = 64
#: agents (and episode -> agent links) a tenant state remembers for the novel-statement
#: rule: which agents report outcomes
OUTCOME_AGENTS_MAX = 4096
#: bytes of the original record kept in a dead letter (base64 makes it 4/3 larger)
MAX_ORIGINAL_BYTES = 256 * 1024
#: an eligibility entry an outcome wrote or promoted to core: still one of the entries a
#: copy of that outcome picks (so the copy picks the same ones), never acted on again
HINDSIGHT_CORE = "hindsight_core"
RETRO_Z_MAX = 10.0  # clip of a stored hindsight z (see `WritePipeline.rescore`)
#: separates tenant and input partition in a checkpoint's key (a tenant holds no ``|``)
STATE_KEY_SEP = "|"

StateKey = tuple[str, int]
"""(tenant, input partition): the unit of operator state a rebalance hands over."""


def state_key(tenant: str, partition: int) -> bytes:
    """The ``models`` topic key of a (tenant, input partition) state: ``tenant|partition``."""
    return f"{tenant}{STATE_KEY_SEP}{partition}".encode()


def parse_state_key(key: bytes) -> tuple[str, int | None]:
    """(tenant, partition) of a checkpoint key; partition None for a per-tenant key of a
    version before per-partition state (``tenant`` alone), which seeds (`WritePipeline.seed`)."""
    text = key.decode()
    tenant, sep, part = text.rpartition(STATE_KEY_SEP)
    if not sep:
        return text, None
    if not tenant or not part.isdigit():
        raise ValueError(f"not a state key: {text!r}")
    return tenant, int(part)


@dataclass(frozen=True)
class RawRecord:
    """A Kafka record as it arrived: bytes plus its coordinates."""

    value: bytes | None
    key: bytes | None
    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None = None
    #: the record's Kafka headers (its credential, `schemas.credentials`)
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass
class BatchResult:
    upserts: dict[Partition, list[dict[str, Any]]] = field(
        default_factory=lambda: {"core": [], "buffer": []}
    )
    events: list[MemoryEvent] = field(default_factory=list)
    dead: list[tuple[bytes | None, DeadLetter]] = field(default_factory=list)
    decisions: list[GateDecision] = field(default_factory=list)
    promote: list[str] = field(default_factory=list)  # buffer -> core moves
    #: (tenant, memory id) of written memories the write path takes back (evicted)
    retract: list[tuple[str, str]] = field(default_factory=list)

    @property
    def stored(self) -> int:
        return len(self.upserts["core"]) + len(self.upserts["buffer"])


def dead_letter(
    raw: RawRecord, reason: str, error_type: str, stage: str, now_ms: int
) -> DeadLetter:
    if raw.value is not None and len(raw.value) > MAX_ORIGINAL_BYTES:
        reason = (
            f"{reason[:1900]} (original truncated to {MAX_ORIGINAL_BYTES} of "
            f"{len(raw.value)} bytes)"
        )
    return DeadLetter(
        reason=reason[:2000],
        error_type=error_type,
        stage=stage,
        topic=raw.topic,
        partition=raw.partition,
        offset=raw.offset,
        key=raw.key.decode("utf-8", "replace")[:256] if raw.key else None,
        # capped, so the dead letter itself fits a broker's default 1 MB message limit
        # (a refused dead letter would stall the partition); `reason` says so
        original_b64=base64.b64encode((raw.value or b"")[:MAX_ORIGINAL_BYTES]).decode(),
        ts=now_ms,
    )


def validation_reason(exc: Exception) -> str:
    """One line a human can act on, from a pydantic or JSON error."""
    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors()[:5]:
            loc = ".".join(str(x) for x in err.get("loc", ())) or "record"
            parts.append(f"{loc}: {err.get('msg')}")
        return "invalid record: " + "; ".join(parts)
    if isinstance(exc, orjson.JSONDecodeError):
        return f"malformed JSON: {exc}"
    return f"{type(exc).__name__}: {exc}"


class TenantState:
    """Everything the write path learns about one tenant."""

    last_loss: float | None = None  # TD loss (mean Huber) of the latest batch (metrics)

    def __init__(self, settings: Settings, dim: int, seed: int = 0) -> None:
        v = settings.value
        self.learner = TDValueLearner(
            dim=dim,
            hidden=v.hidden,
            gamma=v.gamma,
            lr=v.lr,
            polyak=v.polyak,
            replay_size=v.replay_size,
            replay_batch=v.replay_batch,
            seed=seed,
            update_every=v.update_every,
        )
        self.normalizer = RpeNormalizer()
        self.reward_surprise = RewardSurprise()
        self.outcomes = OutcomeHistory()
        #: per (agent, task): recent outcomes, which judge an outcome a failure
        self.contexts = ContextOutcomes()
        self.gate_state = GateState(DecayedQuantileSketch(half_life=settings.gate.half_life))
        #: the scores of agents that never earned a reward (chats): they route by these
        #: where the tenant also holds rewarded agents (`reward_free_gate`)
        self.gate_free = GateState(DecayedQuantileSketch(half_life=settings.gate.half_life))
        #: some agent of the tenant has published a reward (never reset: the bounded
        #: per-agent table may forget that agent, the tenant stays mixed)
        self.mixed = False
        self.smoothers: dict[str, AgentSmoother] = {}
        self.repeats: OrderedDict[str, str] = OrderedDict()
        self.recent: OrderedDict[str, Transition] = OrderedDict()
        self.key_of: OrderedDict[str, str] = OrderedDict()  # memory id -> content key
        self.eligibility = EligibilityWindow(
            horizon=settings.write.eligibility_horizon, ttl_ms=settings.write.eligibility_ttl_ms
        )
        #: episode -> the scale its last processed step saw (`as_of`)
        self.episode_scale: OrderedDict[str, tuple[float, float, float, float, float]] = (
            OrderedDict()
        )
        self.intrinsic = IntrinsicState(dim, intrinsic_config(settings), seed=seed)
        self.settings = settings
        #: episode -> its agent, and the agents an outcome was reported for (`_rescore`)
        self.episode_agent: OrderedDict[str, str] = OrderedDict()
        self.outcome_agents: OrderedDict[str, None] = OrderedDict()

    def smoother(self, agent_id: str) -> AgentSmoother:
        sm = self.smoothers.get(agent_id)
        if sm is None:
            r = self.settings.rpe
            sm = AgentSmoother(alpha=r.smoother_alpha, kappa=r.smoother_kappa)
            self.smoothers[agent_id] = sm
        return sm

    def as_of(
        self, episode_id: str, sigma: float, plan: tuple[float, float, float], scale: float
    ) -> None:
        """Note what an episode's step was judged with: RPE sigma, gate plan, reward
        scale. Hindsight re-scores the episode with the values of its last step, a point
        of the stream, not with those of whenever its outcome is processed (the reward
        scale converts a checkpoint whose TD errors were in reward stds, `RPE_UNIT`)."""
        self.episode_scale[episode_id] = (sigma, *plan, scale)
        self.episode_scale.move_to_end(episode_id)
        while len(self.episode_scale) > self.eligibility.max_episodes:
            self.episode_scale.popitem(last=False)

    def forget_episodes(self) -> None:
        """Drop every open episode (windows, dropped transitions, scales)."""
        self.eligibility = EligibilityWindow(
            horizon=self.eligibility.horizon, ttl_ms=self.eligibility.ttl_ms,
            max_episodes=self.eligibility.max_episodes)  # fmt: skip
        self.recent.clear()
        self.episode_scale.clear()

    @staticmethod
    def link(
        table: OrderedDict[str, Any], key: str, value: Any, limit: int = OUTCOME_AGENTS_MAX
    ) -> None:
        """``table[key] = value`` as the newest entry; the oldest beyond ``limit`` go."""
        table[key] = value
        table.move_to_end(key)
        while len(table) > limit:
            table.popitem(last=False)

    def keep_recent(self, t: Transition) -> None:
        """Dropped transitions of open episodes, for retrospective writes."""
        self.link(self.recent, t.memory_id, t, self.settings.write.retro_cache)

    def remember(self, key: str, route: str, memory_id: str | None = None) -> None:
        self.link(self.repeats, key, route, MAX_REPEAT_KEYS)
        if memory_id is not None:
            self.link(self.key_of, memory_id, key, MAX_REPEAT_KEYS)

    def forget(self, memory_id: str, episode_id: str | None) -> None:
        """Drop every trace of a forgotten memory from this state."""
        self.intrinsic.release(memory_id)
        key = self.key_of.pop(memory_id, None)
        if key is not None:
            self.repeats.pop(key, None)
        self.recent.pop(memory_id, None)
        if episode_id is not None:
            self.eligibility.discard(episode_id, {memory_id})

    def to_bytes(self) -> bytes:
        header = {
            "format": STATE_FORMAT,
            "rpe_unit": RPE_UNIT,
            "normalizer": self.normalizer.to_dict(),
            "reward_surprise": self.reward_surprise.to_dict(),
            "outcomes": self.outcomes.to_dict(),
            "contexts": self.contexts.to_dict(last=CHECKPOINT_CONTEXTS),
            "gate": self.gate_state.to_dict(),
            "gate_free": self.gate_free.to_dict(),
            "mixed": self.mixed,
            "smoothers": {k: s.to_dict() for k, s in self.smoothers.items()},
            "repeats": list(self.repeats.items())[-CHECKPOINT_REPEAT_KEYS:],
            # the repeat keys of the turns on probation: one evicted after a restart
            # must leave the repeat table (the same text sent again is judged afresh)
            "probation_keys": [
                [m, self.key_of[m]] for m in self.intrinsic.probation_ids() if m in self.key_of
            ],
            "learner_b64": base64.b64encode(self.learner.state_bytes()).decode(),
            "intrinsic": self.intrinsic.to_dict(),
            "hindsight": self._hindsight_dict(),
            "episode_agent": list(self.episode_agent.items()),
            "outcome_agents": list(self.outcome_agents),
        }
        return orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)

    def _hindsight_dict(self) -> dict[str, Any]:
        """The open episodes hindsight may still re-score (the `CHECKPOINT_EPISODES` most
        recently written): their windows, the dropped transitions among them, their scale."""
        windows = self.eligibility.to_dict(last=CHECKPOINT_EPISODES)
        keys = [ep["key"] for ep in windows["episodes"]]
        ids = {e["transition_id"] for ep in windows["episodes"] for e in ep["entries"]}
        recent: list[dict[str, Any]] = []
        room = CHECKPOINT_RECENT_BYTES
        for mid in reversed(self.recent):  # newest first, within the byte budget
            if mid in ids:
                item = self.recent[mid].model_dump(mode="json", exclude_none=True)
                room -= len(orjson.dumps(item))
                if room < 0:
                    break
                recent.append(item)
        return {
            "windows": windows,
            "recent": recent[::-1],
            "scale": [[k, list(self.episode_scale[k])] for k in keys if k in self.episode_scale],
        }

    def _load_hindsight(self, d: dict[str, Any], in_reward_stds: bool = False) -> None:
        """``in_reward_stds``: a checkpoint without `RPE_UNIT`; each episode's deltas
        and sigma are converted by the reward scale its last step was judged with."""
        w = d["windows"]
        if in_reward_stds:
            now = self.learner.reward_scale  # an episode without its own: the scale of now
            scales = {str(k): now if v[4] is None else float(v[4]) for k, v in d["scale"]}
            w = {**w, "episodes": [
                {**ep, "entries": [{**e, "delta": float(e["delta"]) * scales.get(ep["key"], now)}
                                   for e in ep["entries"]]}
                for ep in w["episodes"]]}  # fmt: skip
            d = {**d, "scale": [[k, [v[0] * scales[str(k)], *v[1:]]] for k, v in d["scale"]]}
        self.eligibility = EligibilityWindow.from_dict(
            {**w, "horizon": self.eligibility.horizon, "ttl_ms": self.eligibility.ttl_ms}
        )
        for item in d["recent"]:
            try:
                t = Transition.model_validate(item)
            except ValidationError:  # outside today's bounds: it loses its hindsight
                continue  # write, not the tenant its whole checkpoint
            self.recent[t.memory_id] = t
        for k, v in d["scale"]:  # JSON has no infinity: the warm-up's outlier bound is null
            a, b, c, o, e = (math.inf if x is None else float(x) for x in v)
            self.episode_scale[str(k)] = (a, b, c, o, e)

    @classmethod
    def from_bytes(cls, settings: Settings, data: bytes, dim: int | None = None) -> TenantState:
        """Read a checkpoint back; model sizes other than the configured ones (`dim`:
        the encoder's) are refused before anything is allocated (`CheckpointRefused`)."""
        header = orjson.loads(data)
        if header.get("format") != STATE_FORMAT:
            raise ValueError(f"unknown state format {header.get('format')}")
        intr = header.get("intrinsic")
        if intr is not None:
            rnd = intr.get("rnd") or {}
            check_sizes("intrinsic", {"dim": intr.get("dim"), "rnd.dim": rnd.get("dim"),
                                      "rnd.hidden": rnd.get("hidden"), "rnd.out": rnd.get("out")},
                        {"dim": dim, "rnd.dim": dim, "rnd.hidden": RND_HIDDEN,
                         "rnd.out": RND_OUT})  # fmt: skip
        v = settings.value
        expect = {"hidden": v.hidden, "replay_size": v.replay_size, "dim": dim}
        learner = TDValueLearner.from_bytes(
            base64.b64decode(header["learner_b64"]),
            check=lambda config: check_sizes("value model", config, expect),
        )
        learner.update_every = settings.value.update_every  # a changed setting applies
        self = cls.__new__(cls)
        self.settings = settings
        self.learner = learner
        self.normalizer = RpeNormalizer.from_dict(header["normalizer"])
        in_reward_stds = header.get("rpe_unit") != RPE_UNIT
        if in_reward_stds:  # the running scale of TD errors, to reward units (`RPE_UNIT`)
            self.normalizer.mean_sq *= learner.reward_scale**2
        rs = header.get("reward_surprise")  # absent in older checkpoints
        self.reward_surprise = RewardSurprise.from_dict(rs) if rs else RewardSurprise()
        ob = header.get("outcomes")
        self.outcomes = OutcomeHistory.from_dict(ob) if ob else OutcomeHistory()
        ctx = header.get("contexts")  # absent in older checkpoints
        self.contexts = ContextOutcomes.from_dict(ctx) if ctx else ContextOutcomes()
        self.gate_state = GateState.from_dict(header["gate"])
        gf = header.get("gate_free")  # absent in older checkpoints
        self.gate_free = (
            GateState.from_dict(gf)
            if gf
            else GateState(DecayedQuantileSketch(half_life=settings.gate.half_life))
        )
        self.smoothers = {k: AgentSmoother.from_dict(v) for k, v in header["smoothers"].items()}
        self.repeats = OrderedDict((k, v) for k, v in header["repeats"])
        self.recent = OrderedDict()
        # absent in older checkpoints
        self.key_of = OrderedDict((m, k) for m, k in header.get("probation_keys", ()))
        self.eligibility = EligibilityWindow(
            horizon=settings.write.eligibility_horizon, ttl_ms=settings.write.eligibility_ttl_ms
        )
        self.episode_scale = OrderedDict()
        # absent in older checkpoints: no agent is known to report outcomes until one does
        self.episode_agent = OrderedDict(
            (str(k), str(v)) for k, v in header.get("episode_agent", [])
        )
        self.outcome_agents = OrderedDict.fromkeys(str(a) for a in header.get("outcome_agents", []))
        if header.get("hindsight"):  # absent in older checkpoints: open episodes forgotten
            self._load_hindsight(header["hindsight"], in_reward_stds)
        # checkpoints from before the intrinsic score start it fresh
        # the settings' knobs win over the checkpoint's (a changed setting applies)
        icfg = intrinsic_config(settings)
        self.intrinsic = (
            IntrinsicState.from_dict(intr, icfg)
            if intr is not None
            else IntrinsicState(learner.dim, icfg)
        )
        # absent in older checkpoints: their per-agent reward rates say it
        self.mixed = bool(header.get("mixed", False)) or any(
            m.rate > 0.0 for m in self.intrinsic.mix.mixes.values()
        )
        return self


class CheckpointRefused(ValueError):
    """A checkpoint whose model sizes are not the configured ones: never loaded."""


#: the intrinsic score's RND sizes (the `RndSurprise` defaults it is built with)
RND_HIDDEN, RND_OUT = (inspect.signature(RndSurprise).parameters[p].default
                       for p in ("hidden", "out"))  # fmt: skip


def check_sizes(what: str, got: dict[str, Any], expect: dict[str, int | None]) -> None:
    """Refuse `got` unless every size equals the expected one (None: any integer up to the
    largest vector dimension). Runs before a model of that size is built."""
    for name, want in expect.items():
        val = got.get(name)
        if isinstance(val, bool) or not isinstance(val, int):
            ok = False
        else:
            ok = val == want if want is not None else 0 < val <= LIMITS.max_vector_dim
        if not ok:
            raise CheckpointRefused(
                f"{what} checkpoint refused: {name}={val!r}, configured "
                f"{want if want is not None else f'1..{LIMITS.max_vector_dim}'}"
            )


def intrinsic_config(settings: Settings) -> IntrinsicConfig:
    """The intrinsic score's knobs; the guard's calibration, where unset, is the
    encoder's (`GUARD_BY_ENCODER`)."""
    i = settings.intrinsic
    guard = guard_calibration(settings.encoder.name)
    return IntrinsicConfig(
        fit_k=i.fit_k,
        repeat_cos=i.repeat_cos,
        reward_rate_full=i.reward_rate_full,
        off_posterior=guard.off_posterior if i.off_posterior is None else i.off_posterior,
        info_n0=i.info_n0,
        sentence_weight=i.sentence_weight,
        speaker_pooling=i.speaker_pooling,
        disclosure=i.disclosure,
        machine_speakers=tuple(i.machine_speakers),
        update_k=i.update_k,
        repeat_scope=i.repeat_scope,
        lexical=i.lexical,
        recheck_cold=guard.recheck_cold if i.recheck_cold is None else i.recheck_cold,
    )


def intrinsic_scores(
    st: TenantState,
    settings: Settings,
    ts: Sequence[Transition],
    s: np.ndarray,
    s2: np.ndarray,
    r: np.ndarray,
) -> tuple[np.ndarray, list[IntrinsicScore | None] | None]:
    """(w_intrinsic per transition, its intrinsic score or None) for a tenant's batch.

    Each agent's reward rate is folded in first (`AgentRewardMix`); only the
    transitions of agents with w > 0 are scored, in stream order, so a rewarded
    agent pays nothing and its gate score is its extrinsic score alone, even
    beside chats in the same tenant (whose transitions still move the tenant's
    value model and gate thresholds). ``None`` for the scores: nothing was scored.
    """
    w = np.zeros(len(ts), dtype=np.float64)
    if not settings.intrinsic.enabled:
        return w, None
    w = st.intrinsic.mix.observe([t.agent_id for t in ts], r)
    idx = [i for i in range(len(ts)) if w[i] > 0.0]
    if not idx:
        return w, None
    scored = st.intrinsic.score_batch(
        [ts[i].agent_id for i in idx],
        [ts[i].observation for i in idx],
        s[idx],
        s2[idx],
        [ts[i].next_observation is not None or ts[i].next_state is not None for i in idx],
        [ts[i].memory_id for i in idx],
        [ts[i].episode_id for i in idx],
        [ts[i].next_observation for i in idx],
    )
    out: list[IntrinsicScore | None] = [None] * len(ts)
    for i, x in zip(idx, scored, strict=True):
        out[i] = x
    return w, out


def reward_free_gate(
    ts: Sequence[Transition],
    rewards: np.ndarray,
    rewarded: set[str],
    enabled: bool,
    mixed: bool = False,
) -> tuple[list[bool], list[bool]]:
    """Per transition, in stream order: (its agent has published no reward so far, it
    routes by the thresholds of such agents).

    Where a tenant holds agents that earn rewards beside agents that never did (a chat
    beside a grid-world agent), one set of thresholds serves neither: the rewarded
    agents' scores are in units of their RPE, the chat's in typical turns, and the
    chat's turns land above the rewarded agents' bulk as outliers (6 of 7 chat turns to
    core, small talk included). So a transition of an agent without a reward so far
    routes by the reward-free agents' own sketch once some agent of the tenant has
    published one (``rewarded``: the batch's agents with a reward before it; ``mixed``:
    some agent of the tenant had one before; a reward counts from its own transition on, so a batch
    routes as its records one by one would). The tenant's sketch still learns every
    score, so rewarded agents route as before, and a tenant of only chats or of agents
    that all earn rewards on their first steps routes exactly as with one sketch. An
    agent of a sparse-reward environment counts as reward-free until its first reward:
    beside a rewarded agent its steps route by the reward-free sketch until then (its
    score is then mostly the reward-free term too). Off with the intrinsic term (every
    score is then extrinsic).
    """
    n = len(ts)
    if not enabled:
        return [False] * n, [False] * n
    seen = set(rewarded)
    free, own = [False] * n, [False] * n
    for i, (t, reward) in enumerate(zip(ts, rewards.tolist(), strict=True)):
        if reward != 0.0:
            seen.add(t.agent_id)
            mixed = True
        free[i] = t.agent_id not in seen
        own[i] = free[i] and (mixed or bool(seen))
    return free, own


#: gate drops a novel reward-free statement is kept from (`Pipeline._novel_statement`)
KEEPABLE = ("below_low", "below_floor", "warmup")


def content_key(t: Transition) -> str:
    """Identity of a transition's content for the exact-repeat drop.

    The metadata is part of it: the same words in another context (the
    same "The door is now open." in another task) are not a repeat, or a search
    filtered by that context (``metadata_equals``) would find nothing.

    The parts are joined by the unit separator (``\\x1f``), which no id or JSON holds;
    a text or action that holds one is keyed by the JSON of its parts instead (which
    has none), so moving text across the separator is no repeat. The keys of every
    other transition, kept in checkpoints, stay as they are.
    """
    meta = orjson.dumps(t.metadata, option=orjson.OPT_SORT_KEYS).decode() if t.metadata else ""
    text, reward = t.text(), round(t.reward, 6)
    if "\x1f" in text or "\x1f" in t.action:
        raw = orjson.dumps([t.agent_id, text, t.action, reward, meta])
    else:
        raw = f"{t.agent_id}\x1f{text}\x1f{t.action}\x1f{reward}\x1f{meta}".encode()
    return hashlib.blake2b(raw, digest_size=12).hexdigest()


def build_gate(settings: Settings) -> Gate:
    g = settings.gate
    return Gate.percentile(
        q_low=g.q_low,
        q_high=g.q_high,
        floor=g.floor,
        outlier_k=g.outlier_k,
        alpha=g.alpha,
        beta=g.beta,
        half_life=g.half_life,
        warmup=g.warmup,
    )


class WritePipeline:
    """Stateful operator chain for the write path (state per (tenant, partition), in memory)."""

    def __init__(self, settings: Settings, encoder: Encoder, gate: Gate | None = None) -> None:
        self.settings = settings
        self.encoder = encoder
        self.gate = gate or build_gate(settings)
        self.guard = KafkaGuard.from_settings(settings)
        self.states: dict[StateKey, TenantState] = {}
        self.dirty: set[StateKey] = set()
        #: per-tenant checkpoints of a version before per-partition state: each seeds
        #: every partition of its tenant on first use (the automatic migration)
        self.seeds: dict[str, bytes] = {}
        self.processed = 0
        #: per tenant, the highest event time of a transition processed: the hindsight
        #: agent holds an outcome until its episode's transitions are in (`caught_up`)
        self.event_time_seen: dict[str, int] = {}
        # process / rescore / forget / snapshot run in worker threads of two agents
        # (write batches, late outcomes): one at a time per pipeline
        self.lock = threading.RLock()

    # -- state -------------------------------------------------------------
    def state(self, tenant: str, partition: int = 0) -> TenantState:
        """The state of (tenant, partition), created on first use (see the module doc:
        copied from a sibling partition held here, else seeded from a per-tenant
        checkpoint, else cold)."""
        st = self.states.get((tenant, partition))
        if st is None:
            siblings = self.of_tenant(tenant)  # warmer than an old per-tenant seed
            seed = siblings[0].to_bytes() if siblings else self.seeds.get(tenant)
            st = (TenantState.from_bytes(self.settings, seed, self.encoder.dim)
                  if seed is not None
                  else TenantState(self.settings, self.encoder.dim))  # fmt: skip
            st.learner.drop_pending()  # the source's own transitions, trained on there
            st.forget_episodes()  # the source's agents' episodes stay with the source
            st.intrinsic.clear_probation()  # so do its turns on probation
            self.states[(tenant, partition)] = st
        return st

    def tenant(self, name: str, partition: int = 0) -> TenantState:
        return self.state(name, partition)

    @property
    def tenants(self) -> dict[str, TenantState]:
        """tenant -> the state of its lowest partition held here: the one-partition view
        (tools and tests that feed one partition); the write path uses `states`."""
        out: dict[str, TenantState] = {}
        for (tenant, _), st in sorted(self.states.items(), key=lambda kv: kv[0], reverse=True):
            out[tenant] = st
        return out

    def of_tenant(self, tenant: str) -> list[TenantState]:
        """Every state of `tenant` held here, lowest partition first."""
        return [st for (t, _), st in sorted(self.states.items(), key=lambda kv: kv[0])
                if t == tenant]  # fmt: skip

    def keys(self, partitions: Iterable[int]) -> list[StateKey]:
        """State keys held here for these input partitions."""
        parts = set(partitions)
        return sorted(k for k in self.states if k[1] in parts)

    def snapshot(self, tenant: str, partition: int = 0) -> bytes:
        with self.lock:
            return self._snapshot(tenant, partition)

    def _snapshot(self, tenant: str, partition: int) -> bytes:
        return self.states[(tenant, partition)].to_bytes()

    def restore(self, tenant: str, data: bytes, partition: int = 0) -> None:
        with self.lock:
            self._restore(tenant, data, partition)

    def _restore(self, tenant: str, data: bytes, partition: int) -> None:
        self.states[(tenant, partition)] = TenantState.from_bytes(
            self.settings, data, self.encoder.dim
        )

    def seed(self, tenant: str, data: bytes) -> None:
        """Keep a per-tenant checkpoint (older format of key): every partition of `tenant`
        without a checkpoint of its own starts from it. Checked here, used lazily."""
        # unreadable or of other sizes -> raises now, not later
        TenantState.from_bytes(self.settings, data, self.encoder.dim)
        with self.lock:
            self.seeds[tenant] = data

    def drop(self, partitions: Iterable[int]) -> list[StateKey]:
        """Forget the states of these input partitions (revoked: their next owner restores
        them from their checkpoints); returns the keys dropped."""
        with self.lock:
            gone = self.keys(partitions)
            for k in gone:
                del self.states[k]
                self.dirty.discard(k)
            return gone

    # -- decode ------------------------------------------------------------
    def decode(self, raw: RawRecord, now_ms: int) -> Transition | DeadLetter:
        if raw.value is None:
            return dead_letter(raw, "empty record (tombstone)", "InvalidRecord", "decode", now_ms)
        try:
            t = Transition.model_validate(orjson.loads(raw.value))
        except (ValidationError, orjson.JSONDecodeError) as exc:
            return dead_letter(raw, validation_reason(exc), type(exc).__name__, "decode", now_ms)
        if not self.guard.agent_ok(t.tenant, raw.key, raw.value, raw.headers):
            return dead_letter(raw, UNAUTHENTICATED, "Unauthenticated", "auth", now_ms)
        if isinstance(self.encoder, PassthroughEncoder):
            for name, vec in (("state", t.state), ("next_state", t.next_state)):
                if name == "state" and vec is None:
                    return dead_letter(
                        raw,
                        "passthrough encoder needs a state vector",
                        "InvalidRecord",
                        "validate",
                        now_ms,
                    )
                if vec is not None and len(vec) != self.encoder.dim:
                    return dead_letter(
                        raw,
                        f"wrong vector dim: {name} has {len(vec)}, encoder expects "
                        f"{self.encoder.dim}",
                        "InvalidRecord",
                        "validate",
                        now_ms,
                    )
            try:  # the checks the batch's encoding makes (a zero norm), per record
                self.encoder.encode_vectors([v for v in (t.state, t.next_state) if v is not None])
            except ValueError as exc:
                return dead_letter(
                    raw, f"invalid state vector: {exc}", "InvalidRecord", "validate", now_ms
                )
        return t

    def _encode(self, ts: Sequence[Transition]) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(self.encoder, PassthroughEncoder):
            s = self.encoder.encode_vectors([cast(list[float], t.state) for t in ts])
            s2 = self.encoder.encode_vectors(
                [t.next_state or cast(list[float], t.state) for t in ts]
            )
            return s, s2
        texts = [t.text() for t in ts] + [t.next_text() for t in ts]
        both = self.encoder.encode(texts)
        return both[: len(ts)], both[len(ts) :]

    # -- process -----------------------------------------------------------
    def process(self, raws: Sequence[RawRecord], now_ms: int) -> BatchResult:
        with self.lock:
            return self._process(raws, now_ms)

    def _process(self, raws: Sequence[RawRecord], now_ms: int) -> BatchResult:
        result = BatchResult()
        # by (tenant, id): memory ids are unique per tenant only, so another
        # tenant's record with the same id in this batch is not a replay of this one
        good: dict[tuple[str, str], tuple[int, Transition]] = {}
        for raw in raws:
            item = self.decode(raw, now_ms)
            if isinstance(item, DeadLetter):
                result.dead.append((raw.key, item))
            else:  # replay inside one batch: last wins
                good[(item.tenant, item.memory_id)] = (raw.partition, item)
                if item.ts is not None and item.ts > self.event_time_seen.get(item.tenant, -1):
                    self.event_time_seen[item.tenant] = item.ts
        by_key: dict[StateKey, list[Transition]] = {}
        for part, t in good.values():
            by_key.setdefault((t.tenant, part), []).append(t)
        for (tenant, part), ts in by_key.items():
            # cut at the value model's update boundaries: every transition is scored
            # by the model as of the last update, however the stream was batched
            learner, i = self.state(tenant, part).learner, 0
            while i < len(ts):
                n = learner.until_update
                self._process_tenant(tenant, ts[i : i + n], now_ms, result, part)
                i += n
        self.processed += len(raws)
        return result

    def _process_tenant(
        self,
        tenant: str,
        ts: list[Transition],
        now_ms: int,
        out: BatchResult,
        partition: int = 0,
    ) -> None:
        st = self.state(tenant, partition)
        self.dirty.add((tenant, partition))
        s, s2 = self._encode(ts)
        r = np.array([t.reward for t in ts], dtype=np.float64)
        done = np.array([t.done for t in ts], dtype=bool)
        td = st.learner.td_errors(s, r, s2, done)
        values = st.learner.values(s)
        st.last_loss = st.learner.loss_of(td)  # before any step, as `update` reports
        # as of the last update: this chunk never crosses one, so the same for any batching
        reward_scale = st.learner.reward_scale
        # the model's TD errors are in reward stds as of its last update (1 before its
        # first); in reward units their scale (sigma, the gate's, hindsight's) does not
        # change unit at an update, whatever the size of the tenant's rewards
        deltas = td * reward_scale
        st.learner.observe(s, r, s2, done)
        z, sigmas = st.normalizer.normalize_with_scale(deltas)
        drop_exact_repeats = self.settings.gate.drop_exact_repeats
        reward_scores = st.reward_surprise.score_many(r)
        scores = [
            extrinsic_score(st.smoother(t.agent_id).smooth(float(z[i])), float(reward_scores[i]))
            for i, t in enumerate(ts)
        ]
        # reward-free surprise: one gate score, max(extrinsic, w * intrinsic)
        # the batch's agents with a reward before it (its own are folded in next); the
        # tenant's other agents count through ``st.mixed`` alone, not a scan of them all
        mixes = st.intrinsic.mix.mixes
        rewarded = {a for a in {t.agent_id for t in ts} if (m := mixes.get(a)) and m.rate > 0.0}
        w_int, intr = intrinsic_scores(st, self.settings, ts, s, s2, r)
        stored_rpe = [float(x) for x in z]
        if intr is not None:
            ext = scores
            scores = [
                e if x is None else gate_score(e, x.score, float(wi))
                for e, x, wi in zip(ext, intr, w_int.tolist(), strict=True)
            ]
            # where reward-free surprise routed it, that is the memory's surprise (> 0)
            stored_rpe = [
                g if g > e else zr for g, e, zr in zip(scores, ext, stored_rpe, strict=True)
            ]
        # one score at a time: each is routed by the thresholds of the scores before it
        # and then learned, so a batch routes exactly as its records one by one would
        free, own = reward_free_gate(ts, r, rewarded, self.settings.intrinsic.enabled, st.mixed)
        st.mixed = st.mixed or bool(rewarded) or bool(np.any(r != 0.0))
        planned = []
        for i, sc in enumerate(scores):
            if own[i]:  # a chat beside rewarded agents: its own thresholds; the tenant's
                planned.append(self.gate.decide_planned(st.gate_free, sc))  # still learn it
                st.gate_state.sketch.add(float(sc))
            else:
                planned.append(self.gate.decide_planned(st.gate_state, sc))
                if free[i]:  # a reward-free agent's score, for when one is needed
                    st.gate_free.sketch.add(float(sc))
        decisions = [d for d, _ in planned]
        routed: list[str] = []
        for i, t in enumerate(ts):
            score, d = scores[i], decisions[i]
            route: str = d.route
            reason: str = d.reason
            key = content_key(t)
            if drop_exact_repeats and route != "drop":
                prev = st.repeats.get(key)
                if prev == "core" or (prev == "buffer" and route == "buffer"):
                    route, reason = "drop", "repeat"
            if route == "drop" and reason in KEEPABLE and intr is not None:
                if self._novel_statement(st, t, intr[i]):
                    route, reason = "buffer", "novel_statement"
            if route != "drop":
                st.remember(key, route, t.memory_id)
            elif intr is not None and (xi := intr[i]) is not None and xi.off_context and not score:
                reason = "off_context"
            out.decisions.append(d)
            routed.append(route)
            st.as_of(t.episode_id, float(sigmas[i]), planned[i][1], reward_scale)
            st.link(st.episode_agent, t.episode_id, t.agent_id)
            val = valence(float(deltas[i]))
            created = t.ts if t.ts is not None else now_ms
            if route == "drop":
                st.keep_recent(t)
            st.eligibility.add(
                t.episode_id,
                EligibilityEntry.make(
                    transition_id=t.memory_id,
                    step=t.step,
                    embedding=s[i],
                    value=float(values[i]),
                    reward=t.reward,
                    delta=float(deltas[i]),
                    route=route,
                    done=t.done,
                ),
                now_ms,
            )
            ev = MemoryEvent(
                kind="dropped" if route == "drop" else "written",
                memory_id=t.memory_id,
                tenant=tenant,
                agent_id=t.agent_id,
                episode_id=t.episode_id,
                step=t.step,
                partition=None if route == "drop" else cast(Partition, route),
                route=cast(Any, route),
                reward=t.reward,
                rpe=stored_rpe[i],
                rpe_smoothed=float(score),
                gate=float(d.gate),
                valence=val,
                theta_low=float(d.theta_low),
                theta_high=float(d.theta_high),
                reason=reason,
                event_ts=created,  # the stream time the jobs' clocks advance by
                ts=now_ms,
            )
            out.events.append(ev)
            if route == "drop":
                continue
            row = memory_row(
                t,
                tenant,
                s[i],
                stored_rpe[i],
                float(score),
                float(d.gate),
                val,
                created,
                route,
                reason,
                float(d.theta_low),
                float(d.theta_high),
            )
            if intr is not None and (x := intr[i]) is not None:
                row["metadata"]["surprise"] = {
                    "w": round(float(w_int[i]), 4),
                    "intrinsic": round(x.score, 4),
                    "info": round(x.info, 3),
                    "novelty": round(x.novelty, 4),
                    "fit": round(x.fit, 4),
                }
                if x.disclosure:
                    row["metadata"]["surprise"]["disclosure"] = True
                if x.updates is not None and x.updates != t.memory_id:
                    row["metadata"]["updates"] = x.updates
            out.upserts[cast(Partition, route)].append(row)
        if intr is not None:
            # a turn on probation stays there only if the intrinsic score wrote it: the
            # guard's second look takes back what its own pass let in, nothing else
            released = set()
            for t, x, route, g, e in zip(ts, intr, routed, scores, ext, strict=True):
                if x is not None and x.on_probation and (route == "drop" or g <= e):
                    st.intrinsic.release(t.memory_id, t.agent_id, newest=True)
                    released.add(t.memory_id)
            self._vindicate(st, tenant, intr, w_int, [p for _, p in planned], now_ms, out)
            # a turn of this batch can be judged again by a later one before its release
            self._retract(st, tenant, ts, intr, now_ms, out, released)

    def _retract(
        self,
        st: TenantState,
        tenant: str,
        ts: Sequence[Transition],
        intr: Sequence[IntrinsicScore | None],
        now_ms: int,
        out: BatchResult,
        released: set[str],
    ) -> None:
        """Evict the memories the warm context guard judged off-context on a second look
        (`IntrinsicScore.retracts`: turns it let through while it had no yardstick yet).

        A turn stays on probation only while it is written on the intrinsic score's
        account (`_process_tenant` releases the others, ``released`` those of this
        batch; a forget releases it too), and probation is part of the checkpoint, so
        a restart still evicts it. The row is deleted after the batch's upserts
        (`BatchResult.retract`), and an ``evicted`` event (reason ``off_context``)
        tells the jobs and the memory's history; the write path forgets its traces, so
        the same text published again is judged afresh.
        """
        for t, x in zip(ts, intr, strict=True):
            if x is None:
                continue
            for mid, episode in x.retracts:
                if mid in released:  # not written on the intrinsic score's account
                    continue
                st.forget(mid, episode)
                out.retract.append((tenant, mid))
                out.events.append(
                    MemoryEvent(
                        kind="evicted",
                        memory_id=mid,
                        tenant=tenant,
                        agent_id=t.agent_id,
                        episode_id=episode,
                        reason="off_context",
                        event_ts=t.ts if t.ts is not None else now_ms,
                        ts=now_ms,
                    )
                )

    def _novel_statement(self, st: TenantState, t: Transition, x: IntrinsicScore | None) -> bool:
        """A reward-free statement that is new for its agent, of an agent whose episodes
        have had outcomes reported: kept (buffer) whatever the gate's TD-noise rank,
        because an outcome can later prove it decisive only if it is stored. Per agent:
        a chat beside an agent that reports outcomes keeps its own routes."""
        return (
            self.settings.gate.keep_novel_statements
            and x is not None
            and t.reward == 0.0
            and not x.off_context
            and t.agent_id in st.outcome_agents
            and x.novelty >= 1.0 - self.settings.intrinsic.repeat_cos
        )

    def _vindicate(
        self,
        st: TenantState,
        tenant: str,
        intr: Sequence[IntrinsicScore | None],
        w_int: np.ndarray,
        plans: Sequence[tuple[float, float, float]],
        now_ms: int,
        out: BatchResult,
    ) -> None:
        """Write the off-context suspects a later turn referred back to (reason ``referred``).

        The veto only set their score to 0; a turn of the same agent within
        ``lookahead`` turns whose cosine to one clears the off-context threshold
        shows it belonged to the conversation (`operators.surprise`). It is routed by
        its pre-veto score under the gate's plan as of the referring turn (`plans`,
        one per turn: the same whatever the batching; a drop stays a drop; the
        sketch already saw it once, as 0) and the repeat rule; its ``dropped`` event
        is superseded by this ``written`` one, as a retrospective write is.
        """
        for x, w, plan in zip(intr, w_int.tolist(), plans, strict=True):
            if x is None:
                continue
            for mid, raw, vec in x.vindicates:  # suspects of the same agent: its w
                t = st.recent.get(mid)
                s_w = w * raw
                route = self.gate.route(plan, s_w)[0] if t is not None else "drop"
                if t is None or route == "drop":
                    continue
                key = content_key(t)
                prev = st.repeats.get(key)
                if prev == "core" or (prev == "buffer" and route == "buffer"):
                    continue
                st.recent.pop(mid)
                st.remember(key, route, mid)
                created = t.ts if t.ts is not None else now_ms
                strength = float(self.gate.strength(s_w))
                out.events.append(
                    MemoryEvent(
                        kind="written",
                        memory_id=mid,
                        tenant=tenant,
                        agent_id=t.agent_id,
                        episode_id=t.episode_id,
                        step=t.step,
                        partition=cast(Partition, route),
                        route=cast(Any, route),
                        reward=t.reward,
                        rpe=s_w,
                        rpe_smoothed=s_w,
                        gate=strength,
                        valence=0,
                        theta_low=float(plan[0]),
                        theta_high=float(plan[1]),
                        reason="referred",
                        event_ts=created,
                        ts=now_ms,
                    )
                )
                row = memory_row(
                    t,
                    tenant,
                    vec,
                    s_w,
                    s_w,
                    strength,
                    0,
                    created,
                    route,
                    "referred",
                    float(plan[0]),
                    float(plan[1]),
                )
                row["metadata"]["surprise"] = {"w": round(w, 4), "intrinsic": round(raw, 4)}
                out.upserts[cast(Partition, route)].append(row)

    def replayed(self, keys: Iterable[str]) -> None:
        """The store stage did not write these memories (storage keys): they were
        stored already and the batch sent them again (`streams.write.replays`). A
        turn the cold guard let through waits on probation for its second look,
        which could retract it: a memory stored before this batch is not this
        batch's to take back."""
        with self.lock:
            for key in keys:
                tenant, _, memory_id = key.partition(KEY_SEP)
                for st in self.of_tenant(tenant):
                    st.intrinsic.release(memory_id, newest=True)

    def forget(self, tenant: str, memory_id: str, episode_id: str | None) -> None:
        with self.lock:
            self._forget(tenant, memory_id, episode_id)

    def _forget(self, tenant: str, memory_id: str, episode_id: str | None) -> None:
        """A `forgotten` MemoryEvent: remove the memory from the write path's state.

        After this, the same content published again is judged afresh (it is no
        longer a "repeat"), and hindsight re-scoring cannot resurrect it. The
        content-key map is checkpointed only for the turns on probation (their
        eviction must reach it), so forgetting reaches the repeat keys of memories
        stored since the worker's last start and of those.
        """
        for (t, part), st in self.states.items():  # the memory's partition is not known
            if t == tenant:
                st.forget(memory_id, episode_id)
                self.dirty.add((t, part))

    # -- retrospective re-scoring -------------------------------------------
    def caught_up(self, tenant: str, event_ts: int | None) -> bool:
        """True once a transition of `tenant` at or after `event_ts` was processed: an
        outcome stamped then is re-scored with its episode's transitions in."""
        return event_ts is None or self.event_time_seen.get(tenant, -1) >= event_ts

    def rescore(
        self,
        tenant: str,
        episode_id: str,
        outcome: float,
        now_ms: int,
        event_ts: int | None = None,
        outcome_id: str | None = None,
        agent_id: str | None = None,
        task: str | None = None,
        success: bool | None = None,
    ) -> BatchResult:
        with self.lock:
            return self._rescore(tenant, episode_id, outcome, now_ms, event_ts, outcome_id,
                                 agent_id, task, success)  # fmt: skip

    def _rescore(
        self,
        tenant: str,
        episode_id: str,
        outcome: float,
        now_ms: int,
        event_ts: int | None = None,
        outcome_id: str | None = None,
        agent_id: str | None = None,
        task: str | None = None,
        success: bool | None = None,
    ) -> BatchResult:
        """Re-score an episode's eligibility window with what its late outcome reveals.

        Event time decides, not the moment this runs: the RPE sigma and the gate's plan
        are those the episode's last processed step was judged
        with (`TenantState.as_of`), and the outcome is judged against the outcomes
        before it in event time (`OutcomeHistory`; `event_ts`, `outcome_id`, default
        ``<episode>:final``). A copy of an outcome already held is re-scored the same
        way and not counted again.

        Selective (a successful episode must not copy its trajectory into core).
        What the outcome reveals is its surprise against the tenant's usual
        outcome, s = `OutcomeBaseline.surprise` (in mean absolute deviations),
        shrunk by the gate's ``outlier_k``: s_out = sign(s) * max(0, |s| - k),
        so an outcome within the usual spread (a success of a
        tenant that often succeeds) reveals nothing and a rare one only its
        excess. Until two outcomes are known there is no spread: s_out =
        outcome / sigma, the outcome against the tenant's RPE scale (both in
        reward units). It reaches entry t (steps ascending, n entries)
        discounted like an eligibility trace: c_t = gamma^(n - t) * s_out. The
        entry's hindsight z = its live TD z (delta / sigma now) + c_t. Rewards
        inside the episode were already judged by the live gate and are not
        counted again. An entry qualifies when the outcome changed it
        materially (|c_t| >= the gate's floor) and its hindsight |z| routes to
        core under the gate's current plan (the same rule as a live score:
        theta_high or the robust outlier rule). Of those, at most
        ``write.hindsight_max`` (8) per outcome, the largest |c_t| (the steps
        nearest the outcome) first, are written to core if they had been
        dropped (reason ``retrospective``) or promoted from the buffer
        (`BatchResult.promote`). The gate's sketch is not updated: a hindsight
        score is not a new observation. The stored hindsight z is clipped to
        +-``RETRO_Z_MAX`` (the gate compares the unclipped score): against a
        near-zero sigma (a tenant whose rewards were all 0 so far) the raw z is
        astronomically large, and ranking's surprise term is saturated long
        before 10 sigma anyway.

        Then failures write lessons (`_failure_terminal`): an outcome that is a failure
        for its (agent, task) context (`operators.failure`; the agent: the outcome's, else
        the episode's) keeps the terminal steps of an episode that ended.
        """
        out = BatchResult()
        # the state holding the episode: its agent's partition (an episode is one agent's)
        held = [(k, st) for k, st in sorted(self.states.items(), key=lambda kv: kv[0])
                if k[0] == tenant and st.eligibility.get(episode_id)]  # fmt: skip
        if not held:
            return out
        key, st = held[0]
        entries = st.eligibility.get(episode_id)
        gamma = st.learner.gamma
        known = st.episode_scale.get(episode_id)
        if known is not None:
            sigma, plan = known[0], (known[1], known[2], known[3])
        else:  # a window without its scale (not expected): the scale of now
            sigma, plan = st.normalizer.sigma, self.gate.plan(st.gate_state)
        theta_high = plan[1]
        oid = outcome_id or final_outcome_id(episode_id)
        s_out = st.outcomes.surprise(outcome, event_ts, oid)
        st.outcomes.observe(outcome, event_ts, oid)
        if (agent := st.episode_agent.get(episode_id)) is not None:
            st.link(st.outcome_agents, agent, None)
        failure = st.contexts.judge(
            st.contexts.key(agent_id or agent, task), outcome, event_ts, oid, success
        )
        self.dirty.add(key)
        if s_out is None:
            s_out = outcome / sigma
        else:  # within the usual spread reveals nothing; beyond it, only the excess
            s_out = math.copysign(max(0.0, abs(s_out) - self.gate.outlier_k), s_out)
        n = len(entries)
        picked: list[tuple[float, float, EligibilityEntry]] = []
        for idx, e in enumerate(entries):
            c_t = gamma ** (n - idx) * s_out
            if e.route == "core" or abs(c_t) < self.gate.floor:
                continue  # the outcome did not change how surprising this step was
            raw_z = e.delta / sigma + c_t
            if self.gate.route(plan, abs(raw_z))[0] != "core":
                continue
            picked.append((abs(c_t), raw_z, e))
        picked.sort(key=lambda p: -p[0])
        written = {e.transition_id for _, _, e in picked[: self.settings.write.hindsight_max]}
        acted: set[str] = set()  # written to core or promoted there
        for _, raw_z, e in picked[: self.settings.write.hindsight_max]:
            z = max(-RETRO_Z_MAX, min(RETRO_Z_MAX, raw_z))
            score = abs(z)
            val = valence(z)
            strength = float(self.gate.strength(score))

            def event(
                kind: str,
                agent: str | None = None,
                reward: float | None = None,
                e: EligibilityEntry = e,
                z: float = z,
                score: float = score,
                val: int = val,
                strength: float = strength,
                event_ts: int | None = None,
            ) -> MemoryEvent:
                return MemoryEvent(
                    kind=cast(Any, kind),
                    memory_id=e.transition_id,
                    tenant=tenant,
                    agent_id=agent,
                    episode_id=episode_id,
                    step=e.step,
                    partition="core",
                    route="core",
                    reward=reward,
                    rpe=float(z),
                    rpe_smoothed=float(score),
                    gate=strength,
                    valence=val,
                    theta_high=float(theta_high),
                    reason="retrospective",
                    ts=now_ms,
                    event_ts=event_ts,
                )

            if e.route == HINDSIGHT_CORE:
                continue  # an earlier copy of this outcome (or another) put it in core
            if e.route == "buffer":
                out.promote.append(e.transition_id)
                st.intrinsic.release(e.transition_id)  # kept for its outcome now
                out.events.append(event("promoted"))
                acted.add(e.transition_id)
                continue
            t = st.recent.pop(e.transition_id, None)
            if t is None:
                continue  # fell out of the bounded cache: nothing to write
            acted.add(e.transition_id)
            created = t.ts if t.ts is not None else now_ms
            out.upserts["core"].append(
                memory_row(
                    t,
                    tenant,
                    e.vector(),
                    float(z),
                    float(score),
                    strength,
                    val,
                    created,
                    "core",
                    "retrospective",
                    None,
                    float(theta_high),
                )
            )
            out.events.append(event("written", t.agent_id, t.reward, event_ts=created))
        # in core now: a copy of this outcome (an at-least-once replay) picks the same
        # entries and writes and files nothing again
        st.eligibility.mark(episode_id, acted, HINDSIGHT_CORE)
        if failure:
            self._failure_terminal(st, tenant, entries, written, sigma, plan, now_ms, out,
                                   {"outcome": float(outcome), "outcome_id": oid})  # fmt: skip
        if out.events:
            self.dirty.add(key)
        return out

    def _failure_terminal(
        self,
        st: TenantState,
        tenant: str,
        entries: Sequence[EligibilityEntry],
        written: set[str],
        sigma: float,
        plan: tuple[float, float, float],
        now_ms: int,
        out: BatchResult,
        failure: dict[str, Any],
    ) -> None:
        """Write the terminal steps of an episode that ended in failure (reason
        ``failure_terminal``, buffer).

        Only an episode that ended: its last step held is ``done`` (one cut off by a
        step limit or still running has no terminal step), without a negative reward
        (a failure that paid one was judged by the gate as it happened). Of its last
        ``write.failure_terminal_steps`` steps, those the gate dropped and hindsight
        did not just write; not an exact repeat of a stored memory (the repeat rule).
        The row is the one a live write of the transition would be (same id: a
        redelivered outcome or a replay after a restart upserts it again, no
        duplicate), valence -1 (it led to a failure), ``metadata.failure`` = the
        outcome and its id and ``steps_from_end`` (0: the terminal step). Its score is
        its live |z| under the plan its episode was judged with, raised to that plan's
        theta_low (the least a buffer memory scores; stored as ``rpe_smoothed``, and
        ``rpe`` = -score): at the live score the gate dropped it with, maintenance
        would evict it at its next pass as below the buffer's floor. A step written
        here leaves the dropped-transition cache, so a second copy of the outcome
        writes nothing.
        """
        n_last = self.settings.write.failure_terminal_steps
        if n_last <= 0 or not entries or not entries[-1].done or entries[-1].reward < 0:
            return
        n = len(entries)
        for idx in range(max(0, n - n_last), n):
            e = entries[idx]
            if e.route != "drop" or e.transition_id in written:
                continue
            t = st.recent.get(e.transition_id)
            if t is None:
                continue  # fell out of the bounded cache (or stored since)
            ckey = content_key(t)
            prev = st.repeats.get(ckey)
            if prev in ("core", "buffer"):
                continue  # the same content is stored already
            st.recent.pop(e.transition_id)
            st.remember(ckey, "buffer", t.memory_id)
            score = max(float(plan[0]), min(RETRO_Z_MAX, abs(e.delta / sigma)))
            strength = float(self.gate.strength(score))
            created = t.ts if t.ts is not None else now_ms
            row = memory_row(t, tenant, e.vector(), -score, score, strength, -1,
                             created, "buffer", "failure_terminal", float(plan[0]),
                             float(plan[1]))  # fmt: skip
            row["metadata"]["failure"] = {**failure, "steps_from_end": n - 1 - idx}
            out.upserts["buffer"].append(row)
            out.events.append(
                MemoryEvent(
                    kind="written",
                    memory_id=t.memory_id,
                    tenant=tenant,
                    agent_id=t.agent_id,
                    episode_id=t.episode_id,
                    step=t.step,
                    partition="buffer",
                    route="buffer",
                    reward=t.reward,
                    rpe=-score,
                    rpe_smoothed=score,
                    gate=strength,
                    valence=-1,
                    theta_low=float(plan[0]),
                    theta_high=float(plan[1]),
                    reason="failure_terminal",
                    event_ts=created,
                    ts=now_ms,
                )
            )


def memory_row(
    t: Transition,
    tenant: str,
    vector: np.ndarray,
    z: float,
    score: float,
    gate: float,
    val: int,
    created: int,
    route: str,
    reason: str,
    theta_low: float | None,
    theta_high: float,
) -> dict[str, Any]:
    """The Milvus row of a stored transition (layout: `schemas.MemoryRecord`)."""
    return {
        "id": t.memory_id,
        "tenant": tenant,
        "agent_id": t.agent_id,
        "episode_id": t.episode_id,
        "step": t.step,
        "vector": vector,
        "text": t.text(),
        "action": t.action,
        "reward": float(t.reward),
        "rpe": z,
        "rpe_smoothed": score,
        "gate": gate,
        "valence": val,
        "utility": 0.0,
        "uses": 0,
        "merged_count": 1,
        "created_ts": created,
        "last_access_ts": created,
        "metadata": {
            "user": t.metadata,
            "gate": {
                "route": route,
                "reason": reason,
                "theta_low": theta_low,
                "theta_high": theta_high,
            },
            "next": t.next_observation,
            "done": t.done,
        },
    }
