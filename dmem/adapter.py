"""Agent-framework memory adapter: dmem as the memory of a decision loop.

`Memory` wraps a dmem client (`SyncClient`, or anything with the same
``publish``/``search`` methods, see `MemoryClient`) in the shape agent
frameworks expect, without importing any of them:

- RL-style: ``add_memory(observation, action, reward, next_observation, done)``
  after each step, ``get_relevant_memories(state)`` before acting, ``clear()``.
- LangChain-style: ``save_context(inputs, outputs)``,
  ``load_memory_variables(inputs) -> {"memories": [...]}`` and the
  ``memory_variables`` property, so it drops into loops written for
  ``BaseMemory``-like objects (duck typing only; LangChain is not a dependency).

Episode bookkeeping is local to the adapter: it numbers steps 0, 1, 2, ... within
an episode, and after a transition with ``done=True`` (or ``truncated=True``) it
starts a new episode id. Each retrieval carries the current episode id and step,
so the responder emits a `MemoryUsage` event for it (the input of the credit
job). At the end of an episode the adapter reports the episode return as an
`EpisodeOutcome` when the client supports ``report_outcome``.

Writes are asynchronous: a published transition becomes searchable only after
the write path has processed its micro-batch (typically 0.2-1 s), and only if
the dopamine gate kept it (surprising transitions go to ``core``/``buffer``,
expected ones are dropped). Do not expect to read back a step you just added.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from schemas import LIMITS, Hit, Transition
from schemas.models import fit_id

__all__ = ["Memory", "MemoryClient"]

Observation = str | Sequence[float]

# keys tried, in order, when a LangChain-style dict does not name its key
_INPUT_KEYS = ("observation", "state", "input", "question", "query")
_OUTPUT_KEYS = ("action", "output", "answer", "response")
# never taken as the observation/action by the "only value" fallback
_RESERVED = frozenset(
    {"reward", "next_observation", "done", "truncated", "metadata", "filters", "k"}
)


@runtime_checkable
class MemoryClient(Protocol):
    """What the adapter needs from a client (`SyncClient` satisfies it).

    ``report_outcome(episode_id, reward, agent_id=...)`` is optional: used when
    the client has it.
    """

    def publish(self, transition: Transition) -> None: ...

    def search(self, query: str | None = None, k: int = 5, **kw: Any) -> list[Hit]: ...


class Memory:
    """Memory of one agent in one tenant, backed by dmem.

    Args:
        client: a `MemoryClient` (e.g. ``SyncClient(bootstrap, tenant)``).
        tenant: tenant the transitions are written to. Defaults to
            ``client.tenant``; if the client has a tenant and it differs, this
            raises ``ValueError`` (the adapter would write memories it can never
            read back).
        agent_id: written on every transition.
        episode_id: id of the first episode; later ones come from
            ``new_episode_id`` (default: ``"{agent_id}-{random hex}"``, with a
            hash for an agent id too long for that to be an id).
        k: default number of memories ``get_relevant_memories`` returns.
        scope_to_agent: search only this agent's memories (default: the whole
            tenant, so agents of a tenant learn from each other).
        report_outcomes: report each finished episode's return
            (sum of rewards) through ``client.report_outcome`` if available.
        new_episode_id: factory for episode ids (for reproducible ids).
        input_key / output_key: keys ``save_context``/``load_memory_variables``
            read; by default the first present of the usual names.
        clock_ms: event-time source (ms since epoch), injectable for tests.
    """

    memory_key = "memories"

    def __init__(
        self,
        client: MemoryClient,
        tenant: str | None = None,
        agent_id: str = "agent",
        episode_id: str | None = None,
        *,
        k: int = 5,
        scope_to_agent: bool = False,
        report_outcomes: bool = True,
        new_episode_id: Callable[[], str] | None = None,
        input_key: str | None = None,
        output_key: str | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        client_tenant = getattr(client, "tenant", None)
        if tenant is None:
            if not isinstance(client_tenant, str):
                raise ValueError("tenant is required when the client has no tenant")
            tenant = client_tenant
        elif isinstance(client_tenant, str) and client_tenant != tenant:
            raise ValueError(
                f"tenant {tenant!r} differs from the client's tenant {client_tenant!r}: "
                "memories written here could never be read back through this client"
            )
        if k < 1 or k > LIMITS.max_k:
            raise ValueError(f"k must be in 1..{LIMITS.max_k}")
        self.client = client
        self.tenant = tenant
        self.agent_id = agent_id
        self.k = k
        self.scope_to_agent = scope_to_agent
        self.report_outcomes = report_outcomes
        self.input_key = input_key
        self.output_key = output_key
        self._new_episode_id = new_episode_id or self._random_episode_id
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.episode_id = episode_id or self._new_episode_id()
        self.step = 0
        self.episode_return = 0.0
        self.episodes_finished = 0
        self.last_memories: list[dict[str, Any]] = []

    # -- RL-style API ----------------------------------------------------------
    def add_memory(
        self,
        observation: Observation,
        action: str | int,
        reward: float,
        next_observation: Observation | None = None,
        done: bool = False,
        metadata: Mapping[str, str | int | float | bool | None] | None = None,
        *,
        truncated: bool = False,
    ) -> Transition:
        """Publish one step of the current episode and advance the step counter.

        ``observation``/``next_observation`` are text, or a vector of floats
        (stored as ``state``/``next_state``). ``done`` marks a terminal step
        (no bootstrapping from the next state); ``truncated`` ends the episode
        without marking it terminal (e.g. a time limit). Either one starts a new
        episode id after this step and, with ``report_outcomes``, reports the
        episode's return. Returns the published `Transition`.
        """
        fields: dict[str, Any] = {
            "tenant": self.tenant,
            "agent_id": self.agent_id,
            "episode_id": self.episode_id,
            "step": self.step,
            "action": action,
            "reward": float(reward),
            "done": bool(done),
            "ts": self._clock_ms(),
            "metadata": dict(metadata or {}),
        }
        fields.update(_obs_fields(observation, "observation", "state"))
        if next_observation is not None:
            fields.update(_obs_fields(next_observation, "next_observation", "next_state"))
        tr = Transition.model_validate(fields)
        self.client.publish(tr)
        self.step += 1
        self.episode_return += float(reward)
        if done or truncated:
            self.end_episode()
        return tr

    def get_relevant_memories(
        self, state: Observation, k: int | None = None, **filters: Any
    ) -> list[dict[str, Any]]:
        """Memories relevant to ``state``, best first, as plain dicts.

        Each dict has ``memory_id, text, action, reward, rpe, valence, utility,
        partition, episode_id, agent_id, step, created_ts, score`` and
        ``breakdown`` (``semantic, salience, recency, lambda, score, supersedes, lane,
        bonus``).
        ``filters`` pass through to the client's ``search``: structured filters
        (``valence=-1``, ``partition="core"``, ``min_utility=...``,
        ``since_ms``/``until_ms``, ``metadata_equals={...}``) and ranking
        options (``lambda_=...``, ``mmr=True``). The current episode id and
        step are sent along, so the responder emits a usage event for the
        served memories.
        """
        kw: dict[str, Any] = {"episode_id": self.episode_id, "step": self.step}
        if self.scope_to_agent:
            kw["agent_id"] = self.agent_id
        kw.update(filters)
        if isinstance(state, str):
            hits = self.client.search(state, k or self.k, **kw)
        else:
            hits = self.client.search(None, k or self.k, vector=[float(x) for x in state], **kw)
        self.last_memories = [_hit_dict(h) for h in hits]
        return self.last_memories

    def end_episode(self, outcome: float | None = None) -> str:
        """Close the current episode and start a new one; returns the new id.

        Reports ``outcome`` (default: the sum of this episode's rewards) when
        ``report_outcomes`` is on, the client supports it and the episode has
        at least one step. Called automatically by ``add_memory`` on
        ``done``/``truncated``.
        """
        report = getattr(self.client, "report_outcome", None)
        if self.report_outcomes and callable(report) and self.step > 0:
            value = self.episode_return if outcome is None else float(outcome)
            report(self.episode_id, value, agent_id=self.agent_id)
        self.episodes_finished += 1
        self._reset_episode()
        return self.episode_id

    def clear(self) -> None:
        """Start a fresh episode and forget the adapter's *local* state.

        What it does: a new episode id, the step counter back to 0, the running
        episode return to 0, ``last_memories`` emptied. The abandoned episode's
        outcome is not reported.

        What it does NOT do: it does not delete or hide any stored memory.
        Everything already published stays in dmem (transitions still in
        flight are still written) and remains retrievable by this and every
        other agent of the tenant. Deleting memories is ``Client.forget(agent_id=...)``
        (``POST /v1/forget``, over the HTTP API) or the operator's ``dmem forget``.
        """
        self._reset_episode()

    # -- retired LangChain ``BaseMemory``-style aliases ----------------------------
    # LangChain has retired that interface; these stay only as thin aliases of
    # `get_relevant_memories` / `add_memory` for old callers. New code uses
    # `dmem.integrations.langchain.DmemRetriever` or
    # `dmem.integrations.langgraph.DmemStore`.
    @property
    def memory_variables(self) -> list[str]:
        return [self.memory_key]

    def load_memory_variables(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """``{"memories": get_relevant_memories(<the input>)}``.

        The query is ``inputs[input_key]`` (or the first of ``observation,
        state, input, question, query``, or the only value). An optional
        ``inputs["filters"]`` dict is passed through as search filters, and
        ``inputs["k"]`` overrides k.
        """
        query = _pick(inputs, self.input_key, _INPUT_KEYS, "input")
        filters = dict(inputs.get("filters") or {})
        k = inputs.get("k")
        return {self.memory_key: self.get_relevant_memories(query, k=k, **filters)}

    def save_context(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        """Record one step: ``inputs`` hold the observation, ``outputs`` the action.

        ``reward``, ``next_observation``, ``done``, ``truncated`` and
        ``metadata`` are read from ``outputs`` (falling back to ``inputs``);
        reward defaults to 0. A text action longer than the schema limit is cut
        to the limit (LLM answers can be long; the action field is a label).
        """
        obs = _pick(inputs, self.input_key, _INPUT_KEYS, "input")
        action = _pick(outputs, self.output_key, _OUTPUT_KEYS, "output")
        if isinstance(action, str):
            action = action[: LIMITS.max_id_chars * 4]

        def get(key: str, default: Any = None) -> Any:
            if key in outputs:
                return outputs[key]
            return inputs.get(key, default)

        self.add_memory(
            obs,
            action,
            float(get("reward", 0.0)),
            get("next_observation"),
            done=bool(get("done", False)),
            metadata=get("metadata"),
            truncated=bool(get("truncated", False)),
        )

    # -- internals -------------------------------------------------------------
    def _reset_episode(self) -> None:
        self.episode_id = self._new_episode_id()
        self.step = 0
        self.episode_return = 0.0
        self.last_memories = []

    def _random_episode_id(self) -> str:
        return fit_id("", self.agent_id, f"-{uuid.uuid4().hex[:12]}")


def _obs_fields(obs: Observation, text_key: str, vec_key: str) -> dict[str, Any]:
    if isinstance(obs, str):
        return {text_key: obs}
    return {vec_key: [float(x) for x in obs]}


def _pick(d: Mapping[str, Any], key: str | None, candidates: tuple[str, ...], what: str) -> Any:
    if key is not None:
        if key not in d:
            raise KeyError(f"{what} key {key!r} not in {sorted(d)}")
        return d[key]
    for name in candidates:
        if name in d:
            return d[name]
    plain = [v for name, v in d.items() if name not in _RESERVED]
    if len(plain) == 1:
        return plain[0]
    raise KeyError(f"cannot tell which of {sorted(d)} is the {what}; set {what}_key")


def _hit_dict(h: Hit | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(h, Mapping):
        return dict(h)
    return h.model_dump(mode="json", by_alias=True)
