"""Payload models for every topic (docs/architecture.md), plus the Milvus row model.

Decisions:
- Every model carries ``schema_version``; only versions in ``SUPPORTED`` are
  accepted, anything else is a validation error (-> dead letter, reason
  ``unsupported schema_version``).
- Unknown fields are rejected (``extra="forbid"``): a typo in a producer is
  caught at the first record, not discovered as missing data weeks later.
- Floats must be finite (``allow_inf_nan=False``); NaN rewards never reach the
  value model.
- ``transition_id`` defaults to a stable hash of (tenant, agent_id, episode_id,
  step) so replays are idempotent; the memory id is the transition id.
- Memory ids are chosen by clients and are only unique *within a tenant*: two
  tenants may both use ``episode-1:3``. Storage is therefore keyed by
  `storage_key` (tenant, memory id), and the client-facing memory id stays the
  plain id in every payload, response and event.
- ``action`` is text: integer actions are accepted and rendered as strings so
  RL and LLM agents share one field.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from schemas.limits import INT64_MAX, LIMITS, user_part_bytes

SCHEMA_VERSION = 1
SUPPORTED = frozenset({1})

Partition = Literal["core", "buffer"]
Route = Literal["core", "buffer", "drop"]

#: what an id (a tenant, an agent, a memory...) may be made of
IDENT_PATTERN = r"^[A-Za-z0-9_.:@/-]+$"
#: a responder's id in `AccessCount` (fixed length: rows keep some of them, within
#: their byte budget)
PUBLISHER_PATTERN = r"^[0-9a-f]{16}$"
#: a metadata key a search may filter on (``metadata_equals``): a plain identifier, so
#: that no client text ever becomes Milvus expression syntax
META_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
Ident = Annotated[
    str,
    StringConstraints(min_length=1, max_length=LIMITS.max_id_chars, pattern=IDENT_PATTERN),
]


def is_ident(value: object) -> bool:
    """Whether ``value`` is an `Ident` (what a tenant, agent or memory id may be)."""
    return (isinstance(value, str) and len(value) <= LIMITS.max_id_chars
            and re.fullmatch(IDENT_PATTERN[1:-1], value) is not None)  # fmt: skip


#: Kafka's longest topic name
MAX_TOPIC_CHARS = 249
#: a reply topic: an id's characters, as long as Kafka allows (a tenant's own reply topic,
#: ``<responses>.<tenant part>``, passes 128 characters for a long tenant)
TopicName = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_TOPIC_CHARS, pattern=IDENT_PATTERN)
]
Text = Annotated[str, StringConstraints(max_length=LIMITS.max_text_chars)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
#: a reward, an outcome's or feedback's value, a usage weight's bound (`LIMITS.max_abs_value`)
Reward = Annotated[
    float, Field(allow_inf_nan=False, ge=-LIMITS.max_abs_value, le=LIMITS.max_abs_value)
]
#: an event or processing time, ms since the epoch (`LIMITS.max_event_ms`)
EventMs = Annotated[int, Field(ge=0, le=LIMITS.max_event_ms)]
#: a step of an episode (`LIMITS.max_step`)
Step = Annotated[int, Field(ge=0, le=LIMITS.max_step)]
#: hits of one search (`LIMITS.max_k`)
K = Annotated[int, Field(ge=1, le=LIMITS.max_k)]
#: the ranking's mix of meaning (1) and value (0)
Lambda = Annotated[float, Field(ge=0.0, le=1.0)]
#: memories in one page of a listing, and the opaque cursor of the next page
PageLimit = Annotated[int, Field(ge=1, le=LIMITS.max_page)]
Cursor = Annotated[str, Field(max_length=1024)]
#: events in one answer of a memory's history
HistoryLimit = Annotated[int, Field(ge=1, le=LIMITS.max_history)]
Vector = Annotated[list[FiniteFloat], Field(min_length=1, max_length=LIMITS.max_vector_dim)]
MetaValue = str | int | float | bool | None
#: what the agent did: free text ("use key on door") or a discrete action's name
Action = Annotated[str, StringConstraints(max_length=LIMITS.max_id_chars * 4)]


class Model(BaseModel):
    """Base: strict about unknown fields and versions, finite floats."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)

    schema_version: int = SCHEMA_VERSION

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v not in SUPPORTED:
            raise ValueError(f"unsupported schema_version {v} (supported: {sorted(SUPPORTED)})")
        return v


def _check_metadata(v: dict[str, Any]) -> dict[str, Any]:
    if len(v) > LIMITS.max_metadata_keys:
        raise ValueError(f"metadata has {len(v)} keys (max {LIMITS.max_metadata_keys})")
    for key, val in v.items():
        if len(key) > LIMITS.max_id_chars:
            raise ValueError("metadata key too long")
        if isinstance(val, str) and len(val) > LIMITS.max_metadata_value_chars:
            raise ValueError(f"metadata value for {key!r} too long")
        if isinstance(val, float) and val != val:
            raise ValueError(f"metadata value for {key!r} is NaN")
        # within +-INT64_MAX: Milvus' filters cannot name -2^63
        if isinstance(val, int) and not isinstance(val, bool) and abs(val) > INT64_MAX:
            raise ValueError(f"metadata value for {key!r} is outside +-(2^63 - 1)")
    return v


def stable_transition_id(tenant: str, agent_id: str, episode_id: str, step: int) -> str:
    """Deterministic id: the same transition replayed maps to the same memory."""
    raw = f"{tenant}\x1f{agent_id}\x1f{episode_id}\x1f{step}".encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


#: separates tenant and memory id in a storage key; never part of a tenant (``Ident``
#: has no ``|``; the store refuses such tenants), so the key is injective
KEY_SEP = "|"


def storage_key(tenant: str, memory_id: str) -> str:
    """The Milvus primary key of (tenant, memory id): ``tenant|memory_id``.

    Why readable and not a hash: it is injective by construction (a tenant holds
    no ``|``), so no two tenants' rows can share a key whatever ids they pick,
    and an operator can read it.
    """
    if not tenant or KEY_SEP in tenant:
        raise ValueError(f"tenant must be non-empty and hold no {KEY_SEP!r} (got {tenant!r})")
    if not memory_id:
        raise ValueError("empty memory id")
    return f"{tenant}{KEY_SEP}{memory_id}"


class Transition(Model):
    """One step of an agent: what it saw, did, got, and saw next."""

    transition_id: Ident | None = None
    tenant: Ident
    agent_id: Ident
    episode_id: Ident
    step: Step
    observation: Text | None = None
    state: Vector | None = None
    action: Action
    reward: Reward = 0.0
    next_observation: Text | None = None
    next_state: Vector | None = None
    done: bool = False
    ts: EventMs | None = Field(default=None, description="event time, ms since epoch")
    metadata: dict[str, MetaValue] = Field(default_factory=dict)

    @field_validator("action", mode="before")
    @classmethod
    def _action_text(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("action must be text or an integer")
        if isinstance(v, str) and "\x00" in v:  # the dedup job's filters name the action
            raise ValueError("action must not contain a NUL character")
        return str(v) if isinstance(v, int) else v

    @field_validator("metadata")
    @classmethod
    def _meta(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _check_metadata(v)

    @model_validator(mode="after")
    def _complete(self) -> Transition:
        if self.observation is None and self.state is None:
            raise ValueError("a transition needs an observation (text) or a state (vector)")
        if self.state is not None and self.next_state is not None:
            if len(self.state) != len(self.next_state):
                raise ValueError("state and next_state differ in dimension")
        if self.metadata or self.next_observation:
            size = user_part_bytes(self.metadata, self.next_observation)
            if size > LIMITS.max_row_json_bytes:
                raise ValueError(
                    f"metadata and next_observation take {size} bytes as UTF-8 JSON (max "
                    f"{LIMITS.max_row_json_bytes}): a memory row holds at most 64 KiB of JSON"
                )
        if self.transition_id is None:
            self.transition_id = stable_transition_id(
                self.tenant, self.agent_id, self.episode_id, self.step
            )
        return self

    @property
    def memory_id(self) -> str:
        assert self.transition_id is not None
        return self.transition_id

    def text(self) -> str:
        """What gets embedded and shown: the observation, or a rendering of the state."""
        if self.observation is not None:
            return self.observation
        assert self.state is not None
        return "state " + " ".join(f"{x:.4g}" for x in self.state[:64])

    def next_text(self) -> str:
        if self.next_observation is not None:
            return self.next_observation
        if self.next_state is not None:
            return "state " + " ".join(f"{x:.4g}" for x in self.next_state[:64])
        return self.text()


class EpisodeOutcome(Model):
    """The (possibly late) final result of an episode."""

    outcome_id: Ident | None = None
    tenant: Ident
    episode_id: Ident
    agent_id: Ident | None = None
    task: Ident | None = None
    reward: Reward
    success: bool | None = None
    ts: EventMs | None = None
    #: the step at which the outcome was earned (its last reward), if the agent knows
    #: it: memories used after it cannot have contributed (operators/credit.py)
    step: Step | None = None


class Feedback(Model):
    """A late reward on an episode (``kind`` reward, its ``value``) or a user's thumbs on
    one memory (``thumbs_up`` / ``thumbs_down``: credit +1 / -1 whatever the ``value``;
    clients send 1.0 with either, so it is not checked against the kind)."""

    feedback_id: Ident | None = None
    tenant: Ident
    episode_id: Ident | None = None
    memory_id: Ident | None = None
    agent_id: Ident | None = None
    kind: Literal["reward", "thumbs_up", "thumbs_down"] = "reward"
    value: Reward = 0.0
    ts: EventMs | None = None

    @model_validator(mode="after")
    def _target(self) -> Feedback:
        if self.episode_id is None and self.memory_id is None:
            raise ValueError("feedback needs an episode_id or a memory_id")
        if self.kind == "reward" and self.episode_id is None:
            # credit for one memory is a thumbs; a reward is an episode's outcome
            raise ValueError(
                "a reward feedback needs an episode_id (on a memory alone, send "
                "kind thumbs_up or thumbs_down)"
            )
        if self.kind != "reward":
            if self.memory_id is None:  # credit +1 / -1 goes to one memory
                raise ValueError(
                    f"a {self.kind} needs a memory_id (an episode's outcome is kind "
                    "reward with its value)"
                )
        return self


class ForgetRequest(Model):
    """Delete one memory or one agent's memories of a tenant (``POST /v1/forget``).

    A whole tenant is deliberately not a request: that stays the operator's
    ``dmem forget --tenant T`` (audited, run where the store is reachable).
    """

    tenant: Ident
    agent_id: Ident | None = None
    memory_id: Ident | None = None

    @model_validator(mode="after")
    def _scope(self) -> ForgetRequest:
        if self.agent_id is None and self.memory_id is None:
            raise ValueError("forget needs a memory_id or an agent_id")
        return self


class SearchFilters(Model):
    """Structured filters only: never a raw Milvus expression."""

    valence: Literal[-1, 0, 1] | None = None
    partition: Partition | None = None
    since_ms: EventMs | None = None
    until_ms: EventMs | None = None
    min_utility: FiniteFloat | None = None
    metadata_equals: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @field_validator("metadata_equals")
    @classmethod
    def _meta(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _check_metadata(v)


class MemoryListQuery(Model):
    """``GET /v1/memories``: a tenant's memories, newest first, one page at a time.

    The filters are the search's (`SearchFilters`); ``cursor`` is the
    ``next_cursor`` of the previous page (opaque).
    """

    tenant: Ident
    agent_id: Ident | None = None
    limit: PageLimit = Field(default=50, description="memories per page")
    cursor: Cursor | None = None
    filters: SearchFilters = Field(default_factory=SearchFilters)


class BatchGetRequest(Model):
    """``POST /v1/memories:batch_get``: several memories of one tenant by id."""

    tenant: Ident
    ids: list[Ident] = Field(min_length=1, max_length=1000)


class RetrievalRequest(Model):
    request_id: Ident
    tenant: Ident
    agent_id: Ident | None = None
    query: Text | None = None
    vector: Vector | None = None
    k: K = 5
    lambda_: Lambda | None = Field(default=None, alias="lambda")
    filters: SearchFilters = Field(default_factory=SearchFilters)
    mmr: bool = False
    episode_id: Ident | None = None
    step: Step | None = None
    reply_topic: TopicName | None = None
    ts: EventMs | None = None
    as_of: EventMs | None = Field(
        default=None,
        description=(
            "when the question is asked, in event time (ms): memories written after it "
            "are left out, and recency is measured from it instead of the memories' "
            "stream clock (a question about last week, asked of a replayed history)"
        ),
    )

    @model_validator(mode="after")
    def _has_query(self) -> RetrievalRequest:
        if self.query is None and self.vector is None:
            raise ValueError("a retrieval request needs a query (text) or a vector")
        if self.vector is None and self.query is not None and not self.query.strip():
            # an empty text encodes to a vector about nothing: hits at ~0 similarity
            raise ValueError("query is empty: give the text to search for, or a vector")
        return self


class ScoreBreakdown(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    semantic: float
    salience: float
    recency: float
    lambda_: float = Field(alias="lambda")
    score: float
    #: the id of an older memory this one updates and was ranked above (a later
    #: statement of the same thing comes first); None when nothing was re-ordered
    supersedes: str | None = None
    #: which lane served the hit: the main ranking, or the exploration slot (the
    #: last ``DMEM_RESPOND__EXPLORE_SLOTS`` hits, picked optimistically by credit)
    lane: Literal["main", "explore"] = "main"
    #: the main lane's promotion bonus for an established credit effect (in ``score``)
    bonus: float = 0.0


class Hit(BaseModel):
    memory_id: str
    text: str
    action: str
    reward: float
    rpe: float
    valence: int
    utility: float
    partition: Partition
    episode_id: str
    agent_id: str
    step: int
    created_ts: int
    score: float
    breakdown: ScoreBreakdown
    #: the transition's own metadata as the agent sent it (integrations keep keys here)
    metadata: dict[str, Any] = Field(default_factory=dict)
    merged_count: int = Field(default=1, description="transitions this memory stands for")
    merged_ids: list[str] = Field(
        default_factory=list,
        description="ids of the transitions dedup folded into this memory (besides its own; "
        "the most recent ones when there are very many: merged_count counts all)",
    )


class RetrievalResponse(Model):
    request_id: Ident
    tenant: Ident
    hits: list[Hit] = Field(default_factory=list)
    error: str | None = None
    took_ms: float = 0.0


def fit_id(prefix: str, name: str, suffix: str = "") -> str:
    """``prefix + name + suffix`` where that fits an id (`LIMITS.max_id_chars`), else
    with ``name`` replaced by its hash, else (a long prefix or suffix) the hash of the
    whole: ids derived from a client's ids (an outcome's, a thumbs update's, a chat
    session's episode) must validate whatever their length, stay the same for the same
    input, and keep their readable form wherever it fits."""
    out = f"{prefix}{name}{suffix}"
    if len(out) <= LIMITS.max_id_chars:
        return out
    out = f"{prefix}{_digest(name)}{suffix}"
    return out if len(out) <= LIMITS.max_id_chars else _digest(f"{prefix}{name}{suffix}")


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def final_outcome_id(episode_id: str) -> str:
    """The id of an episode's outcome that carries none: its final one. The SDK, HTTP
    ingest, the credit job and hindsight all name it so, so a copy counts once."""
    return fit_id("", episode_id, ":final")


def feedback_key(fb: Feedback) -> str | None:
    """The id of a feedback that carries none, from what it says, so a copy (a retry, a
    replay) counts once on every path: a thumbs on a memory at a time is
    ``<memory_id>:<kind>:<ts>``; a reward on an episode is that episode's final outcome
    (`final_outcome_id`). None for a thumbs without a time: nothing names it."""
    if fb.memory_id is not None and fb.kind != "reward":
        # hashed whole where too long: `feedback_update_id` of it is then the update id
        # the credit job has always given such a thumbs
        return None if fb.ts is None else fit_id("", f"{fb.memory_id}:{fb.kind}:{fb.ts}")
    return None if fb.episode_id is None else final_outcome_id(fb.episode_id)


def feedback_update_id(feedback_id: str) -> str:
    """The credit update id of a thumbs feedback (``fb:`` marks it as feedback in a
    memory's history); a replay of the feedback gives the same id."""
    return fit_id("fb:", feedback_id)


def usage_shares(weights: Sequence[float]) -> list[float]:
    """An agent's usage weights as shares of its decision (sum 1; all 0 stays all 0:
    it acted on none). Scaled by the largest first, so huge finite weights do not
    overflow. The SDK and the HTTP route send what this returns: credit sums
    advantage x share, so an unnormalised report would count several times."""
    top = max((float(w) for w in weights), default=0.0)
    total = sum(float(w) / top for w in weights) if top > 0 else 0.0
    return [float(w) / top / total if total > 0 else 0.0 for w in weights]


class MemoryUsage(Model):
    """Which memories one response served, with their normalised weights.

    The responder's record names each memory's lane (``lanes``: main ranking or
    exploration slot) and the probability its lane served it (``propensities``).

    ``source="served"`` is the responder's record (weights = normalised
    scores). An agent that knows which of the served memories it actually
    used may publish its own record for the same request with
    ``source="agent"`` (weights = its own split, 0 for memories it ignored);
    the credit job then credits that one instead (operators/credit.py).
    An agent record may also carry ``reward``: the reward the agent observed
    right after acting on this decision (its step evidence). Credit uses only
    its sign: an advantage of the opposite sign neither blames a decision that
    was directly rewarded nor credits one that was directly punished.
    """

    tenant: Ident
    episode_id: Ident
    request_id: Ident
    agent_id: Ident | None = None
    step: Step = 0
    memory_ids: list[Ident]
    #: each memory's share of the decision: finite and never negative (0: ignored)
    weights: list[Annotated[float, Field(ge=0.0, le=LIMITS.max_abs_value, allow_inf_nan=False)]]
    ts: EventMs
    source: Literal["served", "agent"] = "served"
    reward: Reward | None = None
    #: per served memory, the lane that served it (responder records; empty: unknown)
    lanes: list[Literal["main", "explore"]] = Field(default_factory=list)
    #: per served memory, the probability it was served by its lane's choice (1.0 for
    #: a deterministic choice), for off-policy evaluation; empty: unknown
    propensities: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(default_factory=list)
    #: per served memory, its cosine similarity to the request's query, clipped to
    #: [0, 1]: the responder's records only (None: unknown; left out of the payload).
    #: Credit remembers how close to a memory the queries were in which it earned its
    #: evidence (`UtilityUpdate.similarity`)
    similarities: list[Annotated[float, Field(ge=0.0, le=1.0)]] | None = None

    @model_validator(mode="after")
    def _aligned(self) -> MemoryUsage:
        if len(self.memory_ids) != len(self.weights):
            raise ValueError("memory_ids and weights differ in length")
        if self.similarities is not None and self.source == "agent":
            raise ValueError("similarities are the responder's: an agent record carries none")
        for name in ("lanes", "propensities", "similarities"):
            if getattr(self, name) and len(getattr(self, name)) != len(self.memory_ids):
                raise ValueError(f"{name} and memory_ids differ in length")
        return self


EventKind = Literal[
    "written", "dropped", "merged", "moved", "promoted", "demoted", "evicted", "forgotten"
]
#: the kinds of a gate decision (one per transition the write path judged, with its
#: score and thresholds); the other kinds are later changes to a memory
DECISION_KINDS: tuple[EventKind, ...] = ("written", "dropped")

#: chat speakers (the ``"speaker: "`` prefix of a chat turn, lower case) that are
#: programs, not people: the roles the LLM APIs give the model's own turns, its system
#: prompt and its tools, and the model's name in ShareGPT-style exports ("gpt"; the
#: user there is "human"). The write path never weighs their first-person sentences as
#: something a person said about themselves (``DMEM_INTRINSIC__MACHINE_SPEAKERS``)
MACHINE_SPEAKERS: tuple[str, ...] = (
    "assistant", "ai", "bot", "model", "system", "developer", "tool", "function",
    "gpt", "chatgpt", "llm",
)  # fmt: skip


def machine_speaker_names(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` as a chat turn's speaker is matched against them: stripped, lower
    case. A blank name is an error (it would match no prefix)."""
    out = tuple(str(n).strip().lower() for n in names)
    if not all(out):
        raise ValueError(f"machine_speakers must be non-empty names, got {out}")
    return out


class MemoryEvent(Model):
    """What happened to a memory, and why: the audit trail and the metrics feed."""

    kind: EventKind
    memory_id: Ident
    tenant: Ident
    agent_id: Ident | None = None
    episode_id: Ident | None = None
    step: int | None = None
    partition: Partition | None = None
    route: Route | None = None
    reward: FiniteFloat | None = None
    rpe: FiniteFloat | None = None
    rpe_smoothed: FiniteFloat | None = None
    gate: FiniteFloat | None = None
    valence: int | None = None
    theta_low: FiniteFloat | None = None
    theta_high: FiniteFloat | None = None
    reason: str = ""
    event_ts: EventMs | None = Field(
        default=None,
        description="event time of the source transition (its ts, or the write worker's clock "
        "when it had none): the stream time the jobs' watermarks advance by",
    )
    ts: EventMs = Field(description="processing time, ms")


class UtilityUpdate(Model):
    """A credit to apply to a memory's utility; `update_id` makes it idempotent."""

    update_id: Ident
    memory_id: Ident
    tenant: Ident
    credit: FiniteFloat
    uses: int = Field(default=1, ge=0, le=LIMITS.max_step)
    ts: EventMs
    #: False: uses only (the memory was served, not acted on); the utility stays
    evidence: bool = True
    similarity: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description=(
            "the weighted mean similarity of the queries in which the memory was acted on "
            "for this credit (from the responder's usage records); the applier keeps its "
            "discounted mean, and ranking applies the memory's credit to queries about as "
            "close to it as those (None: unknown, e.g. thumbs)"
        ),
    )
    episode_id: Ident | None = Field(
        default=None, description="the episode whose outcome (or feedback) earned the credit"
    )
    feedback_partition: int | None = Field(
        default=None,
        ge=0,
        description=(
            "partition of the feedback topic holding the record (outcome or feedback) "
            "that earned the credit; with `feedback_offset`, the applier holds an update "
            "whose memory is not stored until the hindsight agent has committed that "
            "record (its retrospective writes are then stored)"
        ),
    )
    feedback_offset: int | None = Field(
        default=None, ge=0, description="offset of that record (see `feedback_partition`)"
    )


class AccessCount(Model):
    """Retrievals of one memory that a responder served since its last report.

    The respond role publishes these (``dmem.access``, keyed by memory id, so one
    memory's counts keep their order on one partition) and the jobs role folds them
    into the row (``metadata.access.n``, ``last_access_ts``): every read-modify-write
    of a stored row runs in the jobs role, under its lock.
    """

    memory_id: Ident
    tenant: Ident
    n: int = Field(ge=1, le=LIMITS.max_step, description="retrievals since the last report")
    ts: EventMs = Field(description="stream time of the latest of them, on the memory's own clock")
    publisher: str = Field(
        pattern=PUBLISHER_PATTERN,
        description="the publishing responder's id, drawn at random when it starts",
    )
    seq: int = Field(
        ge=1,
        le=LIMITS.max_step,
        description="the publisher's round: grows with every publish, and a record sent "
        "again after an unacknowledged send keeps its round (the jobs role adds it once)",
    )


class DeadLetter(Model):
    """A record that could not be processed, with the reason and its original bytes."""

    reason: str
    error_type: str
    stage: str
    topic: str
    partition: int | None = None
    offset: int | None = None
    key: str | None = None
    original_b64: str
    ts: EventMs


class MemoryRecord(BaseModel):
    """One stored memory: the row layout of the Milvus collection.

    `milvus/` derives its collection schema from these fields (the
    ``json_schema_extra["milvus"]`` hints give max lengths and the vector field).
    ``key`` is the primary key, ``storage_key(tenant, id)``: set by the store on
    every write (a caller's value is ignored) and never returned by reads; ``id``
    is the client-facing memory id, unique only within its tenant.
    """

    key: str = Field(default="", json_schema_extra={"milvus": {"primary": True, "max_length": 257}})
    id: str = Field(json_schema_extra={"milvus": {"max_length": 128}})
    tenant: str = Field(json_schema_extra={"milvus": {"max_length": 128}})
    agent_id: str = Field(json_schema_extra={"milvus": {"max_length": 128}})
    episode_id: str = Field(json_schema_extra={"milvus": {"max_length": 128}})
    step: int
    vector: list[float] = Field(json_schema_extra={"milvus": {"vector": True}})
    text: str = Field(json_schema_extra={"milvus": {"max_length": LIMITS.max_text_chars * 4}})
    # bytes: a Transition's action may hold LIMITS.max_id_chars * 4 characters of UTF-8
    action: str = Field(json_schema_extra={"milvus": {"max_length": LIMITS.max_id_chars * 16}})
    reward: float
    rpe: float
    rpe_smoothed: float
    gate: float
    valence: int
    utility: float = 0.0
    uses: int = 0
    merged_count: int = 1
    created_ts: int
    last_access_ts: int
    metadata: dict[str, Any] = Field(default_factory=dict)


class IngestAccepted(BaseModel):
    """The 202 answer of HTTP ingest (``POST /v1/transitions|outcomes|feedback``):
    every record was acknowledged by the broker (acks=all) before this was sent."""

    accepted: int
    ids: list[str] = Field(description="transition_id / outcome_id / feedback_id, in order")
    topic: str


class ErrorBody(BaseModel):
    """The JSON body of every HTTP error: a message, and for 422 every reason."""

    error: str
    detail: list[dict[str, Any]] | None = None
