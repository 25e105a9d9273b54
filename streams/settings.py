"""The one settings object (`DMEM_` prefix, ``__`` nesting), built once and passed down.

Examples: ``DMEM_KAFKA__BROKER=kafka://10.0.0.5:9092``, ``DMEM_MILVUS__URI=http://milvus:19530``,
``DMEM_GATE__Q_HIGH=0.95``, ``DMEM_ENCODER__NAME=hash``. Units are in the names
(``_ms``, ``_s``). Defaults run the embedded stack: Milvus Lite under
``data_dir`` and a broker on localhost.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from schemas.models import MACHINE_SPEAKERS, machine_speaker_names


class KafkaSettings(BaseModel):
    broker: str = Field(
        default="kafka://127.0.0.1:9092",
        description="bootstrap servers, `kafka://host:port` (several joined by `;` or `,`)",
    )
    topic_prefix: str = Field(default="dmem.", description="prefix of every topic name")
    partitions: int = Field(
        default=4, ge=1, le=1024, description="partitions of the topics `dmem topics create` makes"
    )
    replication_factor: int = Field(
        default=1, ge=1, description="replication factor of created topics"
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="passed to aiokafka and faust"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        default=None, description="SASL mechanism (with a SASL protocol)"
    )
    sasl_username: str | None = Field(default=None, description="SASL user")
    sasl_password: str | None = Field(default=None, description="SASL password")
    ssl_cafile: str | None = Field(default=None, description="CA bundle for TLS")
    session_timeout_s: float = Field(
        default=10.0,
        description="Short session/rebalance timeouts: a restarted worker rejoins in seconds.",
    )
    rebalance_timeout_s: float = Field(default=5.0, description="consumer-group rebalance timeout")
    heartbeat_interval_s: float = Field(
        default=1.0, description="consumer-group heartbeat interval"
    )
    commit_interval_s: float = Field(
        default=1.0, description="auto-commit interval of the groups that auto-commit"
    )

    @field_validator("broker")
    @classmethod
    def _url(cls, v: str) -> str:
        if "://" not in v:
            v = "kafka://" + v
        if not v.startswith("kafka://"):
            raise ValueError(f"broker URL must look like kafka://host:port, got {v!r}")
        return v

    @property
    def bootstrap(self) -> str:
        """host:port list for aiokafka."""
        return self.broker.removeprefix("kafka://").replace(";", ",")


class MilvusSettings(BaseModel):
    uri: str = Field(
        default="",
        description="`http://host:19530` for a server; empty: Milvus Lite file under data_dir",
    )
    collection: str = Field(default="dmem_memories", description="collection name")
    token: str | None = Field(default=None, description="Milvus token (`user:password`)")
    timeout_s: float = Field(default=10.0, description="timeout of one Milvus call")
    search_consistency: Literal["Strong", "Bounded", "Session", "Eventually"] = Field(
        default="Bounded",
        description=(
            "Searches use bounded staleness: a Strong read waits for the next server time tick (200"
            " ms by default). Writes and the jobs' reads stay Strong."
        ),
    )
    history_per_memory: int = Field(
        default=200,
        ge=1,
        le=10_000,
        description="events kept per memory in the history collection (the oldest go first)",
    )
    history_per_tenant: int = Field(
        default=200_000,
        ge=100,
        description="events kept per tenant in the history collection (the oldest go first)",
    )
    tombstone_ttl_s: float = Field(
        default=3600.0,
        gt=0.0,
        description=(
            "how long a forgotten memory id is refused by every write (`milvus.tombstones`)"
        ),
    )
    tombstone_file: Path | None = Field(
        default=None,
        description=(
            "keep the forget refusals in this file as well, so a restarted worker still "
            "refuses what was forgotten in the last tombstone_ttl_s; needed where the "
            "control topic does not survive a restart (`dmem up` sets it: its broker is "
            "memory-only); empty: the control topic alone"
        ),
    )


class RespondSettings(BaseModel):
    concurrency: int = Field(
        default=4, ge=1, le=64, description="Kafka requests handled at once per respond worker"
    )
    fetch_max_wait_ms: int = Field(
        default=5,
        ge=0,
        le=10_000,
        description=(
            "The request consumer's fetch wait. The embedded Tansu broker answers a fetch only when"
            " fetch_max_wait_ms expires, not when a record arrives, so a short wait is the latency "
            "floor of the Kafka path; the price is ~200 empty fetches/s while idle. Apache Kafka "
            "answers as soon as data arrives: raise this to 100-500 there."
        ),
    )
    idle_fetch_max_wait_ms: int = Field(
        default=50,
        ge=0,
        le=10_000,
        description=(
            "The request consumer's fetch wait once no Kafka request came for idle_after_s: the "
            "worker's event loop, which also serves HTTP, then answers 20 empty fetches/s instead "
            "of 200; the first Kafka request after such a quiet spell waits up to this long, and "
            "the next ones get fetch_max_wait_ms again. Set it to fetch_max_wait_ms to keep the "
            "short wait always."
        ),
    )
    idle_after_s: float = Field(
        default=30.0, gt=0.0, description="seconds without a Kafka request before the idle wait"
    )
    count_ttl_s: float = Field(
        default=30.0, ge=0.0, description="cache lifetime of a tenant's memory count (sets lambda)"
    )
    half_life_s: float = Field(
        default=30 * 24 * 3600.0,
        gt=0.0,
        description="half-life of the recency term of the ranking; the least one, see "
        "maintenance.span_factor (an agent whose stream spans longer ranks on its span)",
    )
    lambda_hi: float = Field(
        default=0.97,
        ge=0.0,
        le=1.0,
        description=(
            "salience and recency only break near-ties of meaning: at most (1 - lambda) / lambda of"
            " cosine (lambda depends on how many memories the tenant holds, not on credit)"
        ),
    )
    lambda_lo: float = Field(
        default=0.9,
        ge=0.0,
        le=1.0,
        description="lambda of a mature tenant (at least `mature` memories)",
    )
    young: int = Field(default=200, ge=1, description="memories up to which a tenant is young")
    mature: int = Field(default=20_000, ge=2, description="memories from which a tenant is mature")
    explore: float = Field(
        default=1.0,
        ge=0.0,
        description="optimism bonus for untried memories in a request that fixes lambda "
        "(it fades with credited uses); a default search's main lane gives every memory "
        "the full bonus, its optimism being the exploration lane's",
    )
    explore_slots: int = Field(
        default=1,
        ge=0,
        le=8,
        description="served hits (the last ones, for k >= 3) picked by the exploration "
        "lane: optimistically over each memory's credited evidence; 0 turns it off",
    )
    explore_c: float = Field(
        default=1.0,
        ge=0.0,
        description="exploration lane's optimism: credited mean + explore_c / sqrt(1 + uses)",
    )
    promote_max: float = Field(
        default=0.6,
        ge=0.0,
        le=1.0,
        description="largest main-lane bonus (in cosine) of an established credit effect",
    )
    promote_min_uses: int = Field(
        default=2,
        ge=1,
        description="acted-on uses before a credit effect can be established (promote/demote)",
    )
    promote_full: int = Field(
        default=8,
        ge=1,
        description="credited uses among a query's candidates at which the bonus is full "
        "(it anneals in with the context's evidence)",
    )
    credit_fit_margin: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description=(
            "a memory's credit counts in full for queries up to this much less similar to "
            "it than those in which it earned the credit, and fades to none at twice "
            "this; 0: credit counts for every query"
        ),
    )
    tenant_searches: int = Field(
        default=4,
        ge=1,
        le=256,
        description=(
            "searches of one tenant answered at once on a respond worker, HTTP and Kafka "
            "together; more wait their turn, so one tenant cannot hold every search thread"
        ),
    )
    tenant_search_queue: int = Field(
        default=32,
        ge=0,
        le=10_000,
        description=(
            "searches of one tenant waiting for a turn; beyond it a search is refused at once "
            "(HTTP 429 with Retry-After, a Kafka reply with a `busy:` error)"
        ),
    )
    live_per_tenant: int = Field(
        default=2000,
        ge=0,
        le=100_000,
        description=(
            "the live page (streams.respond.live): newest MemoryEvents kept per tenant for its most"
            " recently active tenants; 0 turns the page's background consumer off"
        ),
    )
    live_max_tenants: int = Field(
        default=64,
        ge=1,
        le=10_000,
        description="tenants the live page's ring keeps (most recently active)",
    )


class IngestSettings(BaseModel):
    """HTTP ingest on the respond role (`streams.respond.ingest`, ``DMEM_INGEST__*``)."""

    max_batch: int = Field(
        default=1000, ge=1, le=100_000, description="most records one POST may carry (else 413)"
    )
    max_body_bytes: int = Field(
        default=8 << 20, ge=1024, description="largest request body (else 413)"
    )
    max_inflight: int = Field(
        default=5000,
        ge=1,
        description="records produced and not yet "
        "acknowledged by the broker, all requests together (else 429)",
    )
    max_inflight_per_tenant: int = Field(
        default=2000,
        ge=1,
        description="records of one tenant produced and not yet acknowledged (else 429 for "
        "that tenant only): one tenant cannot take the whole max_inflight",
    )
    ack_timeout_s: float = Field(
        default=10.0, gt=0.0, description="wait for the broker's acks=all before 503"
    )
    retry_after_s: int = Field(default=2, ge=1, description="Retry-After of a 429/503")

    @model_validator(mode="after")
    def _fits(self) -> IngestSettings:
        limit = min(self.max_inflight, self.max_inflight_per_tenant)
        if self.max_batch > limit:
            raise ValueError(
                f"ingest max_batch ({self.max_batch}) must not exceed max_inflight "
                f"({self.max_inflight}) nor max_inflight_per_tenant "
                f"({self.max_inflight_per_tenant}): such a batch never fits"
            )
        return self


class JobsSettings(BaseModel):
    credit_gamma: float = Field(
        default=0.99, ge=0.0, le=1.0, description="discount of an outcome back to the step of a use"
    )
    credit_ttl_ms: int = Field(default=3_600_000, ge=1000, description="usage/outcome join window")
    credit_lateness_ms: int = Field(
        default=1_000,
        ge=0,
        description=(
            "event time: usage and feedback wait until their tenant's watermark is this "
            "far past them and are joined in event-time order; records later than this "
            "join in arrival order. Short, because credit feeds what the next episode "
            "retrieves: an agent that runs an episode a second sees credit a second late"
        ),
    )
    credit_idle_s: float = Field(
        default=2.0,
        gt=0.0,
        description=(
            "processing time: usage and feedback wait (in event-time order) until their "
            "tenant's watermark is credit_lateness_ms past them, or the input "
            "was idle this long (when the credit job joins them, never in what order)"
        ),
    )
    credit_hold_s: float = Field(
        default=10.0,
        ge=0.0,
        description=(
            "a utility update that names no feedback record, for a memory not stored "
            "yet, waits this long for its row (later updates of that memory behind it) "
            "before it is skipped; one that names its outcome waits until the hindsight "
            "agent has committed that outcome, however long"
        ),
    )
    credit_discount: float = Field(
        default=0.95,
        gt=0.0,
        le=1.0,
        description="discount of a memory's older credit in its statistics (mean, variance)",
    )
    credit_free_min: int = Field(
        default=3,
        ge=1,
        description="outcomes of episodes that acted on no memory from which they are the "
        "(agent, task)'s credit baseline (else the mean of all its outcomes)",
    )
    credit_max_episodes: int = Field(
        default=100_000,
        ge=1,
        description="open credit episode windows of a jobs worker, all tenants together",
    )
    credit_max_episodes_per_tenant: int = Field(
        default=10_000,
        ge=1,
        description=(
            "open credit episode windows of one tenant: a tenant at its cap evicts its own "
            "least recently active window, never another tenant's (`operators.credit`)"
        ),
    )


class MaintenanceSettings(BaseModel):
    """Dedup/merge, decay and capacities (`streams.jobs.dedup`, `streams.jobs.decay`,
    `operators.dedup`, `operators.decay`).

    ``dedup_tau`` is encoder dependent; unset, it is the encoder's default
    (`operators.dedup.DEDUP_TAU_BY_ENCODER`): 0.95 for the hash encoder (keeps
    distinct grid cells of the demo apart: max cross-cell cosine 0.92), 0.98 for
    MiniLM and minilm-static, which rate different short sentences closer (false
    merges on real text). ``dedup_reward_tol``: memories merge only if their
    rewards have one sign and differ by at most this share of the larger magnitude.
    """

    enabled: bool = Field(default=True, description="run the dedup and decay jobs")
    dedup_tau: float | None = Field(
        default=None, gt=0.0, le=1.0, description="merge at cosine >= tau; unset: per encoder"
    )
    dedup_reward_tol: float = Field(
        default=0.01, ge=0.0, lt=1.0, description="relative reward tolerance of a merge"
    )
    dedup_window_s: float = Field(
        default=2.0,
        gt=0.0,
        description=(
            "processing time: due memories are deduped at most this often, and a tenant "
            "whose input was idle this long has all its pending memories deduped (when, "
            "never what: see allowed_lateness_ms)"
        ),
    )
    dedup_max_window: int = Field(
        default=5000, ge=1, description="most memories one dedup step reads (due ones in order)"
    )
    allowed_lateness_ms: int = Field(
        default=60_000,
        ge=0,
        description=(
            "event time: a new memory is deduped once its tenant's watermark (highest "
            "event time seen) is this far past its event time; a hindsight write older "
            "than this when it arrives is late (deduped on arrival against newer ones)"
        ),
    )
    dedup_k: int = Field(default=8, ge=1, le=1024, description="ANN neighbours per new memory")
    decay_interval_s: float = Field(default=10.0, gt=0.0, description="period of the decay pass")
    half_life_s: float = Field(
        default=7 * 24 * 3600.0,
        gt=0.0,
        description=(
            "half-life of the |rpe| term; the least one, see span_factor (a clock that "
            "spans longer decays more slowly)"
        ),
    )
    utility_weight: float = Field(
        default=1.0, ge=0.0, description="weight of tanh(utility) in the decay priority"
    )
    access_weight: float = Field(
        default=0.25, ge=0.0, description="weight of the access term in the decay priority"
    )
    access_half_life_s: float = Field(
        default=24 * 3600.0,
        gt=0.0,
        description="half-life of the access term (time since last access)",
    )
    buffer_floor: float = Field(default=0.05, ge=0.0, description="evict buffer below this")
    buffer_ttl_s: float = Field(
        default=14 * 24 * 3600.0,
        gt=0.0,
        description=(
            "buffer memories unseen this long (stream time) are evicted; the least TTL, "
            "see span_factor"
        ),
    )
    span_factor: float = Field(
        default=1.0,
        ge=0.0,
        allow_inf_nan=False,
        description=(
            "horizons follow each clock's own span: half-life and buffer TTL, and the "
            "ranking's recency half-life, are at least this times (the clock's watermark - "
            "its earliest event time), so time alone never ages away, nor ranks down, the "
            "past of a stream that spans months (a chat whose sessions are weeks apart); "
            "what goes is then decided by value and capacity. A stream that spans less "
            "than the fixed horizons (an RL run of hours) is unchanged. 0: fixed horizons"
        ),
    )
    demote_below: float = Field(default=0.3, ge=0.0, description="demote core below this")
    promote_above: float = Field(default=0.5, ge=0.0, description="earned value to promote")
    core_capacity: int = Field(default=10_000, ge=0, description="per tenant")
    buffer_capacity: int = Field(default=50_000, ge=0, description="per tenant")
    max_actions_per_pass: int = Field(
        default=5000, ge=1, description="most moves and deletions one decay pass makes"
    )
    # ages (decay, TTL, capacity priorities) are stream time: the watermark of the
    # memory's clock, one per (tenant, agent) or one per tenant (operators.decay)
    stream_clock: Literal["agent", "tenant"] = Field(
        default="agent", description="whose highest event time a memory's age is measured to"
    )
    refresh_per_pass: int = Field(default=2000, ge=0, description="rows re-read per pass")
    access_flush_s: float = Field(
        default=30.0,
        gt=0.0,
        description=(
            "How often the respond role publishes its retrieval counts (`dmem.access`); the "
            "jobs role folds them into the served rows, and every fold rewrites them (Milvus 2.3 "
            "has no partial update: delete + insert, then compaction and index builds on the "
            "server); rewriting every 2 s showed up as the read path's p99. Access recency at "
            "30 s granularity is ample next to decay half-lives of hours to days; a kill of a "
            "respond worker loses at most one interval of retrieval counts (published on a "
            "clean stop)."
        ),
    )

    @model_validator(mode="after")
    def _hysteresis(self) -> MaintenanceSettings:
        if self.promote_above <= self.demote_below:
            raise ValueError("maintenance promote_above must exceed demote_below")
        return self


class EncoderSettings(BaseModel):
    """Which encoder turns texts into vectors (`operators.encoders`).

    ``device`` applies to the torch MiniLM only (the static and hashing encoders
    are table lookups on the CPU): ``cuda`` / ``cuda:N`` runs it on a GPU, and a
    worker fails at start, loudly, if that device is missing (never a silent
    fall back to the CPU, whose throughput is 10-100x lower).
    """

    name: Literal["minilm", "minilm-static", "hash", "passthrough"] = Field(
        default="minilm-static",
        description=(
            "`minilm-static` (static embeddings distilled from the bundled MiniLM), `minilm` (torch"
            " MiniLM, contextual), `hash` (fast, no semantics), `passthrough` (state vectors)"
        ),
    )
    device: str = Field(
        default="cpu",
        pattern=r"^(cpu|cuda(:\d+)?)$",
        description="torch device of minilm: cpu, cuda or cuda:N",
    )
    dim: int = Field(default=256, ge=2, le=4096, description="hash/passthrough dim")
    cache_size: int = Field(
        default=50_000, ge=0, description="entries of the encoder's LRU cache of texts"
    )
    static_path: str | None = Field(
        default=None,
        description="where minilm-static is distilled (default ~/.cache/dmem/minilm-static-384)",
    )


class ValueSettings(BaseModel):
    hidden: int = Field(default=64, ge=4, description="hidden units of the per-tenant value MLP")
    gamma: float = Field(default=0.95, ge=0.0, le=1.0, description="discount of the TD(0) target")
    lr: float = Field(default=3e-3, gt=0.0, description="learning rate of the value model")
    polyak: float = Field(
        default=0.05, gt=0.0, le=1.0, description="Polyak rate of the target network"
    )
    replay_size: int = Field(
        default=4096, ge=0, description="transitions kept in the replay reservoir"
    )
    replay_batch: int = Field(default=64, ge=1, description="replayed transitions per update")
    update_every: int = Field(
        default=256,
        ge=1,
        le=256,
        description="transitions per (tenant, input partition) between value-model updates, "
        "whatever the micro-batching (operators/value.py: the memory must not "
        "depend on how a client publishes); at most 256, the checkpoint's row "
        "budget (pending transitions are checkpointed)",
    )


class RpeSettings(BaseModel):
    smoother_alpha: float = Field(
        default=0.05, gt=0.0, le=1.0, description="EMA rate of the per-agent |z| level"
    )
    smoother_kappa: float = Field(
        default=0.25,
        ge=0.0,
        description="weight of that level: s = |z| / (1 + kappa * EMA_agent(|z|))",
    )


class IntrinsicSettings(BaseModel):
    """Reward-free surprise mixed into the gate score (`operators.surprise`)."""

    enabled: bool = Field(
        default=True, description="mix the reward-free surprise into the gate score"
    )
    fit_k: float = Field(
        default=0.0,
        description="off-context below unrelated mean + k std "
        "(a later turn that fits a vetoed one that well writes it: referred)",
    )
    repeat_cos: float = Field(
        default=0.9, gt=0.0, lt=1.0, description="turns closer than this to a memory are discounted"
    )
    reward_rate_full: float = Field(
        default=0.01,
        gt=0.0,
        le=1.0,
        description=(
            "share of an agent's transitions with a reward that turns its intrinsic "
            "surprise fully off (per agent: a chat beside a rewarded agent keeps its own)"
        ),
    )
    info_n0: float | None = Field(
        default=4.0,
        ge=0.0,
        allow_inf_nan=False,
        description=(
            "the information term is the text's token surprisal per token, shrunk by this "
            "many tokens (sum / (n + n0)), so a long turn does not outrank a short "
            "disclosure by length; null: the summed surprisal"
        ),
    )
    sentence_weight: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "a text's information is (1 - w) x its whole text's per-token term + "
            "w x its most informative sentence's, so one specific fact in a long "
            "answer is not diluted by the generic sentences around it; 0: whole text "
            "(with info_n0 null, the summed term, it does not apply)"
        ),
    )
    speaker_pooling: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description=(
            "how far each speaker of a chat (the 'speaker: ' prefix of a turn) is judged "
            "against its own typical turn: the information is divided by that speaker's "
            "running mean to this power (0: one yardstick for all speakers; 1: each only "
            "against itself), so a verbose speaker does not crowd out a terse one"
        ),
    )
    disclosure: float = Field(
        default=0.3,
        ge=0.0,
        allow_inf_nan=False,
        description=(
            "a turn in which its speaker states something about itself (a sentence with "
            "a first-person word that is not a question: 'my sister moved to Chicago') "
            "carries 1 + this times its information, before the speaker's yardstick "
            "(0: off; the words cover English, German, French, Spanish, Italian, "
            "Portuguese, Dutch, Russian, Chinese and Japanese)"
        ),
    )
    machine_speakers: list[str] = Field(
        default_factory=lambda: list(MACHINE_SPEAKERS),
        description=(
            "speakers of a chat (the 'speaker: ' prefix, any case) that are programs, "
            "not people: their first-person sentences ('I'd recommend', 'as an AI, I "
            "don't') are never weighed as disclosures; the default is the chat roles of "
            "the LLM APIs (a JSON list; [] weighs every speaker's)"
        ),
    )

    @field_validator("machine_speakers")
    @classmethod
    def _speaker_names(cls, v: list[str]) -> list[str]:
        return list(machine_speaker_names(v))

    repeat_scope: Literal["episode", "agent"] = Field(
        default="episode",
        description=(
            "where a near-repeat (cosine above repeat_cos) is discounted: 'episode' against "
            "the agent's memories of the same episode (a chat session) only, so a "
            "restatement in a later session, a change or a confirmation of state, is "
            "judged on its information; 'agent' against all of the agent's memories"
        ),
    )
    update_k: float = Field(
        default=3.0,
        ge=0.0,
        allow_inf_nan=False,
        description=(
            "a written chat turn whose nearest earlier memory of the same agent is this "
            "many standard deviations above the unrelated level (the similarity, meaning "
            "and words, between unrelated turns) speaks of the same thing: it is recorded "
            "as an update of that memory, and a search that finds both ranks the later first"
        ),
    )
    lexical: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description=(
            "the context guard's similarity of two chat turns mixes the cosine of their "
            "embeddings with this share of the cosine of their words (each distinct word "
            "weighted by its surprisal): a turn pasted from another conversation is often "
            "close in meaning to its neighbours but rarely shares their names, places and "
            "things (0: embeddings only)"
        ),
    )
    off_posterior: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="off-context also where the estimated posterior of 'injected' exceeds "
        "this (contamination-adaptive cut; 0.9: injected nine times as likely as real; "
        "1 = off); unset: per encoder (`operators.surprise.GUARD_BY_ENCODER`: 0.75 for "
        "minilm, 0.9 for the others)",
    )
    recheck_cold: bool | None = Field(
        default=None,
        description="turns the context guard let through before it had its yardstick (a "
        "tenant's first turns, while the unrelated level and the contamination estimate "
        "warm up) are judged again by the warm guard once the turns after them have "
        "arrived; a written one it vetoes then is evicted (reason off_context); unset: "
        "per encoder (`operators.surprise.GUARD_BY_ENCODER`: on for minilm, whose "
        "contamination estimate stays near the truth on clean chats; off for the others, "
        "where it runs high and the second look costs real turns)",
    )


class GateSettings(BaseModel):
    q_low: float = Field(
        default=0.5,
        gt=0.0,
        lt=1.0,
        description="running quantile of the gate score under which a transition is dropped",
    )
    q_high: float = Field(
        default=0.9,
        gt=0.0,
        lt=1.0,
        description="running quantile at or above which a transition goes to core",
    )
    floor: float = Field(
        default=0.5,
        ge=0.0,
        description=(
            "absolute floor of the thresholds, lowered to the mundane bulk's edge where the stream "
            "separates scores below it"
        ),
    )
    outlier_k: float = Field(
        default=3.0,
        gt=0.0,
        description=(
            "robust outlier rule: s >= floor and s >= median + max(k * 1.4826 * MAD, floor) "
            "goes to core"
        ),
    )
    alpha: float = Field(
        default=2.0, description="slope of the stored gate value g = sigmoid(alpha * s - beta)"
    )
    beta: float = Field(default=2.0, description="offset of the stored gate value")
    half_life: float = Field(
        default=5000.0,
        gt=0.0,
        description="observations after which old scores weigh half in the quantile sketch",
    )
    warmup: int = Field(
        default=50,
        ge=0,
        description="observations decided by the fixed warm-up rule while the sketch fills",
    )
    drop_exact_repeats: bool = Field(default=True, description="drop exact repeats already in core")
    keep_novel_statements: bool = Field(
        default=True,
        description="a reward-free statement, new for its agent (no near-repeat), that the "
        "gate would drop goes to the buffer instead once an outcome was reported for one "
        "of that agent's episodes (per agent: a chat beside it routes as before): "
        "credit can later prove it decisive (and promote it to core)",
    )

    @model_validator(mode="after")
    def _order(self) -> GateSettings:
        if self.q_low >= self.q_high:
            raise ValueError(f"gate q_low ({self.q_low}) must be below q_high ({self.q_high})")
        return self


class AuthSettings(BaseModel):
    """HTTP API bearer tokens (see `streams.auth`): enabled and fail-closed by default."""

    disabled: bool = Field(
        default=False,
        description="`true` turns HTTP auth off (the embedded `dmem up` and demo set it)",
    )
    tokens: dict[str, list[str]] = Field(
        default_factory=dict, description='{"token": ["tenant", ...]}; "*" = all'
    )
    tokens_file: Path | None = Field(
        default=None, description="JSON file of the same shape as `tokens` (merged)"
    )
    kafka: bool | None = Field(
        default=None,
        description=(
            "record credentials on Kafka (`streams.auth.KafkaGuard`): agent records must carry"
            " an HMAC of a token listing their tenant, internal topics the service's signature;"
            " null: on when HTTP auth is on and tokens are configured, true: on (no tokens:"
            " every agent record is refused), false: off (anyone who can produce is trusted)"
        ),
    )
    service_secret: str | None = Field(
        default=None,
        description=(
            "secret of the service key that signs internal topics (control, models, memories,"
            " credit, access); the same on every worker. Unset: derived from the token map, so"
            " changing a token invalidates the signatures of earlier checkpoints"
        ),
    )


class WriteSettings(BaseModel):
    batch_size: int = Field(
        default=512, ge=1, le=100_000, description="most records in one micro-batch"
    )
    batch_within_s: float = Field(default=0.2, gt=0.0, description="longest wait for a record")
    linger_s: float = Field(
        default=0.0,
        ge=0.0,
        description=(
            "0: a batch is what the consumer has buffered (no waiting for company, the default: "
            "lowest latency, batches grow with load). > 0: wait up to this long after the first "
            "record for the batch to fill to batch_size (the demo uses it so every run sees "
            "identical micro-batches)."
        ),
    )
    checkpoint_every_s: float = Field(
        default=5.0, gt=0.0, description="period of the operator-state checkpoints"
    )
    eligibility_horizon: int = Field(
        default=64, ge=1, description="last transitions of an episode kept for hindsight writes"
    )
    eligibility_ttl_ms: int = Field(
        default=3_600_000,
        ge=1000,
        description="how long an episode's window waits for its outcome (ingestion time)",
    )
    retro_cache: int = Field(
        default=10_000, ge=0, description="dropped transitions kept for retrospective writes"
    )
    hindsight_max: int = Field(
        default=8,
        ge=0,
        description="most transitions one outcome may "
        "write or promote (the most surprising in hindsight)",
    )
    failure_terminal_steps: int = Field(
        default=2,
        ge=0,
        le=64,
        description=(
            "an episode that ended (its last step done) with an outcome that is a failure for "
            "its (agent, task) (the lower half of the range of that context's outcomes, or "
            "success false) keeps this many of its last steps that the gate dropped: written "
            "to the buffer with reason failure_terminal (a death that paid no negative reward "
            "is otherwise lost); 0 turns it off"
        ),
    )
    outcome_wait_s: float = Field(
        default=30.0,
        ge=0.0,
        description=(
            "an outcome whose event time is ahead of the transitions the write path has "
            "processed waits up to this long for them, or until the write path has stored "
            "everything it has read, before it is re-scored (an outcome read before its "
            "episode would find nothing to re-score)"
        ),
    )
    retry_initial_s: float = Field(
        default=0.2, description="first backoff of a failed Milvus write"
    )
    retry_max_s: float = Field(default=10.0, description="longest backoff of a failed Milvus write")


class Settings(BaseSettings):
    # "null" in a variable sets an optional field to None (DMEM_INTRINSIC__INFO_N0=null)
    model_config = SettingsConfigDict(
        env_prefix="DMEM_", env_nested_delimiter="__", extra="ignore", env_parse_none_str="null"
    )

    app_id: str = Field(
        default="dmem",
        description=(
            "prefix of the consumer groups (`<app_id>-write`, `-respond`, ...) and faust app id"
        ),
    )
    data_dir: Path = Field(
        default=Path("dmem-data"), description="Milvus Lite file (`milvus.db`) and local state"
    )
    runtime_dir: Path = Field(
        default=Path("~/.cache/dmem/up"),
        description=(
            "where `dmem up` announces itself (streams.local.announce): the client "
            "commands (`dmem search`, `wait`, `report`, ...) find a running stack there "
            "when neither `DMEM_KAFKA__BROKER` nor `DMEM_MILVUS__URI` is set"
        ),
    )
    web_host: str = Field(
        default="127.0.0.1",
        description="address the worker's web server binds (`0.0.0.0` in containers)",
    )
    web_port: int = Field(
        default=6066,
        ge=0,
        le=65535,
        description="port of `/health`, `/metrics` and, on respond workers, the HTTP API",
    )
    web_allowed_hosts: list[str] = Field(
        default_factory=list,
        description=(
            "Host header names the web server answers (else 421; DNS rebinding). Empty: the "
            "loopback names when web_host is a loopback address, any host otherwise; "
            '`["*"]`: any host (`streams.webguard`)'
        ),
    )
    web_allowed_origins: list[str] = Field(
        default_factory=list,
        description=(
            "browser origins (`https://app.example.com`) allowed besides the allowed hosts; a "
            "request from any other Origin is refused with 403 where hosts are restricted"
        ),
    )
    metrics_tenant_labels: Literal["hash", "name", "none"] = Field(
        default="hash",
        description=(
            "the `tenant` label of /metrics (open to scrapers): a hash of the id, the id "
            "itself (trusted scrapers only), or none (one series for all tenants)"
        ),
    )
    log_level: Literal["debug", "info", "warn", "error", "crit"] = Field(
        default="warn", description="log level of the worker"
    )
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    milvus: MilvusSettings = Field(default_factory=MilvusSettings)
    encoder: EncoderSettings = Field(default_factory=EncoderSettings)
    value: ValueSettings = Field(default_factory=ValueSettings)
    rpe: RpeSettings = Field(default_factory=RpeSettings)
    gate: GateSettings = Field(default_factory=GateSettings)
    intrinsic: IntrinsicSettings = Field(default_factory=IntrinsicSettings)
    write: WriteSettings = Field(default_factory=WriteSettings)
    respond: RespondSettings = Field(default_factory=RespondSettings)
    ingest: IngestSettings = Field(default_factory=IngestSettings)
    jobs: JobsSettings = Field(default_factory=JobsSettings)
    maintenance: MaintenanceSettings = Field(default_factory=MaintenanceSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)

    @property
    def milvus_uri(self) -> str:
        """Empty URI means Milvus Lite under data_dir (the embedded default)."""
        if self.milvus.uri:
            return self.milvus.uri
        return str((self.data_dir / "milvus.db").resolve())

    def group(self, role: str) -> str:
        """Consumer group of a role's plain aiokafka loop (e.g. ``dmem-write``)."""
        return f"{self.app_id}-{role}"

    def topic(self, logical: str) -> str:
        from schemas.topics import topic_name

        return topic_name(logical, self.kafka.topic_prefix)


#: settings whose keys or values are secrets: an error names the setting, never its content
SECRET_LOCS = (("auth", "tokens"), ("kafka", "sasl_password"), ("milvus", "token"))


def setting_error(exc: ValidationError | SettingsError) -> str:
    """The first error of a settings `ValidationError` as one line: ``bad setting loc: msg``.

    A location inside a secret (a token of ``auth.tokens`` is a dict key, so it is part of
    the location) is cut at the setting's name; the input value is never shown. A
    variable that is not JSON where JSON is expected (`SettingsError`) is named by its
    field, not quoted.
    """
    if isinstance(exc, SettingsError):
        return f"bad setting: {exc} (not valid JSON?)"
    first = exc.errors(include_input=False, include_url=False)[0]
    loc = tuple(str(x) for x in first.get("loc", ()))
    for secret in SECRET_LOCS:
        if loc[: len(secret)] == secret:
            loc = secret
    return f"bad setting {'.'.join(loc)}: {first.get('msg')}"
