"""Reward-free surprise: what a transition tells the agent that it did not know.

Most agent traffic carries no reward (chats, tool calls), so the extrinsic RPE is
0 and the gate has nothing to rank. This module scores a transition without a
reward, per tenant, learned online; `gate_score` mixes it with the extrinsic
score. Time is never read here; everything is a function of the stream.

The intrinsic score is ``info * novelty_factor`` divided by the tenant's running
mean information (1 = a typical turn, so the gate's floor 0.5 means "half of what
a typical turn says"), and 0 when the turn is off-context:

- **Information** (`TokenSurprisal`): the Shannon surprisal of the text's tokens
  under the tenant's online unigram model (hashed counts, add-a smoothing), per
  token with ``info_n0`` tokens of shrinkage, ``sum / (n + n0)``, in nats.
  Greetings and back-channel are a few frequent tokens; a turn that introduces
  people, places and events is rare ones. Per token, not summed: a sum grows with
  length, so it would rank an assistant's long answers above the user's short
  disclosures ("The play I attended was The Glass Menagerie"), which are what
  later questions ask about; the shrinkage keeps a one-word turn with one rare
  token from outranking a sentence. Tokens are words of any script (`words`), and
  each character of Chinese and Japanese, which are written without spaces. Half
  of it (``sentence_weight``) is the same term of the turn's most informative
  sentence (`TokenSurprisal.best_sentence`):
  per token over the whole text, one specific fact in a long answer ("12 of the 23
  games were played at Arrowhead") is diluted by the generic sentences around it.
  Transitions without text use the error of a random-network-distillation
  predictor on the embedding (`RndSurprise`).
- **Disclosure** (`discloses`): a turn in which its speaker states something about
  itself (a sentence with a first-person word that is not a question: "I just got
  back from a festival in Brooklyn", "my sister moved to Chicago") carries
  ``1 + disclosure`` times its information, over that speaker's mean factor (so
  within a speaker a disclosure ranks above a request, and a speaker who discloses
  in every turn scores as without it), before the speaker's yardstick. The gate's
  thresholds are the tenant's, so the speaker who discloses more still gains storage
  from the other (docs/design/2026-12-03-disclosure.md). Facts
  about the speaker are what later questions about a person ask for, and they hide
  in turns whose words are common ("I've been listening to audiobooks during my
  commute"); a request ("Can you recommend...?") is not one. The words are a small
  list over several languages (`FIRST_PERSON`); a text in another language
  scores as before.
- **Novelty against what is stored**: 1 - max cosine to the agent's bank of
  stored embeddings. A near-repeat of a memory is worth little however
  informative it was the first time: the score is scaled by
  ``min(1, (1 - max_cos) / (1 - repeat_cos))``.
- **Context fit (the noisy-TV guard)**: prediction-error curiosity is drawn to
  noise, which is maximally novel. A real turn is related to its neighbourhood
  (``fit`` = the largest cosine to the agent's last ``window`` turns and its next
  observation); an injected one is not. The yardstick is the agent's own
  "unrelated" level: the running mean and std of the cosine between a turn and
  the bank (near-repeats, >= ``repeat_cos``, left out). A turn whose fit is below
  mean + ``fit_k`` * std (default 0: it fits its neighbours no better than an
  average unrelated memory does) is off-context and scores 0 (reason
  ``off_context``), unless its summed information is ``fit_exempt`` typical turns'
  worth or more (a fact announced out of the blue).
- **Words beside meaning** (``lexical``): every similarity the guard takes (the fit,
  the unrelated level, the suspects, the contamination's draws) is the embeddings'
  cosine mixed with the cosine of the turns' surprisal-weighted word vectors
  (`IntrinsicState.lexical`): a pasted turn can be close in meaning to its neighbours
  but rarely shares their names, places and things. Novelty stays on embeddings.
- **Suspects and vindication**: a vetoed turn waits for the agent's next
  ``lookahead`` turns; the first whose similarity to it clears the threshold it failed
  refers back to it (`IntrinsicScore.vindicates`) and the write path writes it
  then (reason ``referred``). A topic opener whose reply came late is recovered;
  an injected turn, which nothing refers to, stays dropped.
- **Contamination-adaptive cut** (`Contamination`): a fixed margin cannot suit a
  clean stream and a contaminated one at once, so the guard also estimates, per
  tenant, how much of its stream is off-context and the posterior that a turn
  with a given fit is, and vetoes below max(``fit_k``, the fit where that
  posterior reaches ``off_posterior``). Default 0.9: only where injected is at
  least nine times as likely as real (losing a real turn costs more than keeping a
  distractor, and on a clean chat the estimate of the injected share runs high:
  measured in docs/design/2026-12-03-conversation-defaults.md); 0.75 with torch
  MiniLM (`GUARD_BY_ENCODER`), whose estimate stays nearer the truth.
- **A second look for the cold guard's passes** (``recheck_cold``; on with torch
  MiniLM, off with the other encoders, `GUARD_BY_ENCODER`):
  a tenant's first turns meet a guard without a yardstick (no unrelated level, no
  contamination estimate), which lets injected turns through. With it on, each turn
  the cold guard lets through waits on probation until its window is complete and the
  guard is warm, and is judged again as a live turn would be then
  (`IntrinsicScore.retracts`); the write path evicts those it had written. Off for
  the encoders whose contamination estimate runs high on clean chats, where the
  second look costs real turns (docs/design/2026-12-04-cold-guard-recheck.md,
  docs/design/2026-12-04-guard-per-encoder.md).
- **The mix** (`AgentRewardMix`, `gate_score`): per agent, rewards switch the
  intrinsic score off; a chat beside a rewarded agent in one tenant keeps its own.
- **Batch independence**: every part is decided per turn in stream order; the
  bank is the turns this state rates as memories (score >= ``bank_min``,
  vindicated suspects included), not the gate's later routes, so a turn scores
  the same whatever batch it arrived in.

Checkpoints (`IntrinsicState.to_dict`) hold the token counts (float16), the RND
predictor, the running means, the mix's reward rate and the contamination
histograms, the suspects still waiting for a reply (of the 256 agents that
had them last) and, with ``recheck_cold``, the turns on probation. The bank (with
its word vectors), the recent turns and the turns whose window is still open are
rebuilt by live traffic: after a restart novelty is
measured against what came since and the guard waits for context (it never vetoes
without one).

Measurements and rejected alternatives: docs/design/2026-12-01-context-guard.md.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import io
import math
import re
import unicodedata
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from schemas.models import MACHINE_SPEAKERS, machine_speaker_names

__all__ = [
    "AgentRewardMix",
    "Contamination",
    "IntrinsicConfig",
    "IntrinsicScore",
    "IntrinsicState",
    "RewardMix",
    "RndSurprise",
    "TokenSurprisal",
    "GUARD_BY_ENCODER",
    "GuardCalibration",
    "discloses",
    "speaker_of",
    "gate_score",
    "guard_calibration",
]

#: scripts written without spaces between words (Han, Hiragana, Katakana, half-width
#: Katakana): each of their characters is a token of its own (a unigram model over
#: characters, as for Chinese text); a whole clause would otherwise be one token
_NO_SPACES = (
    "\u3041-\u3096\u309d-\u309f\u30a1-\u30fa\u30fc-\u30ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uf900-\ufaff\uff66-\uff9d\U00020000-\U0002ebef"
)


def _marks() -> str:
    """Character-class ranges of the combining marks (Unicode category M) of the Basic
    Multilingual Plane: the vowel signs of Hindi or Thai and the accents of decomposed
    Latin, which belong to the word they sit in."""
    ranges: list[tuple[int, int]] = []
    for c in range(0x10000):
        if unicodedata.category(chr(c))[0] == "M":
            if ranges and ranges[-1][1] == c - 1:
                ranges[-1] = (ranges[-1][0], c)
            else:
                ranges.append((c, c))
    return "".join(f"\\u{a:04x}-\\u{b:04x}" for a, b in ranges)


#: a token: one character of `_NO_SPACES`, or a run of letters, digits and combining
#: marks of any other script with apostrophes inside ("i'm", "café", "привет",
#: "नमस्ते"); for ASCII text exactly ``[a-z0-9']+``
_TOKEN = re.compile(rf"[{_NO_SPACES}]|(?:[^\W_{_NO_SPACES}]|[{_marks()}]|')+")
_ASCII_TOKEN = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    """The tokens (`_TOKEN`) of ``text``: lower case, composed (NFC, so a decomposed
    "nós" is the word "nós"), a typographic apostrophe read as a straight one ("I’m" is
    "i'm"). Letters of every script count, so a chat in any language is scored on its
    words."""
    if text.isascii():  # the common case, cut the same four times faster
        return _ASCII_TOKEN.findall(text.lower())
    return _TOKEN.findall(unicodedata.normalize("NFC", text.lower()).replace("\u2019", "'"))


@functools.lru_cache(maxsize=1 << 17)
def _fnv1a(token: str) -> int:
    """A token's stable 64-bit hash: FNV-1a over its bytes (Python's hash() is salted
    per process). Cached: a chat's words repeat (Zipf), and this byte loop in Python
    is the costly part of tokenising a turn."""
    h = 0xCBF29CE484222325
    for b in token.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


_MIX_FORMAT = 1
#: dimensions of a turn's word vector (`IntrinsicState.lexical`): token buckets folded
LEX_DIM = 512
#: pairs of a bank's memories the cold unrelated level needs (`IntrinsicState._cold_unrelated`)
COLD_PAIRS = 10
MAX_COUNT = 30_000.0  # token counts are halved beyond this (float16-safe checkpoints)

#: the speaker of a chat turn: the ``"speaker: "`` prefix of the chat mapping's text
SPEAKER_PREFIX = re.compile(r"^([^:\n]{1,64}):\s")
#: first-person words (singular and plural) of English, German, French, Spanish,
#: Italian, Portuguese, Dutch, Russian, Chinese and Japanese, as `words` cuts them
#: (lower case; a Chinese or Japanese word is its first character: "我们" is "我", "们").
#: Not the Japanese "私": in Chinese it is "private" ("私立", "隐私")
FIRST_PERSON = frozenset(
    "i i'm im i've ive i'd i'll my me mine myself we we're we've we'd we'll our ours us "
    "ourselves ich mein meine meinen meinem meiner mich mir wir uns unser unsere je j'ai "
    "j'avais j'etais j'étais moi mon ma mes nous notre nos yo mi mí mis nosotros "
    "nosotras nuestro nuestra io mio mia miei mie noi nostro nostra eu meu minha meus "
    "minhas nós ik mijn wij ons onze я мой моя моё мое мои меня мне мной мы наш наша "
    "наше наши нас нам нами 我 僕 俺".split()
)
#: a sentence: up to its end mark (Latin or CJK full-width), or the end of a line
_SENTENCE = re.compile(r"[^.!?。！？\n]+[.!?。！？]*")


def speaker_of(text: str) -> str:
    """The speaker of a chat turn: its ``"speaker: "`` prefix, stripped and in lower
    case ("" without one)."""
    m = SPEAKER_PREFIX.match(text)
    return m.group(1).strip().lower() if m else ""


def discloses(text: str, machine_speakers: frozenset[str] | tuple[str, ...] = ()) -> bool:
    """Whether ``text`` (after a ``"speaker: "`` prefix) has a sentence that is not a
    question and holds a first-person word (`FIRST_PERSON`): the speaker says
    something about itself. Never for a speaker named in ``machine_speakers`` (lower
    case): a language model's "I" ("I'd recommend", "I hope this helps", "as an AI,
    I don't") says nothing about a person that a later question could ask about."""
    if machine_speakers and speaker_of(text) in machine_speakers:
        return False
    m = SPEAKER_PREFIX.match(text)
    body = text[m.end() :] if m else text
    for sentence in _SENTENCE.findall(body):
        s = sentence.strip()
        if not s or s.endswith(("?", "？")):
            continue
        if any(w in FIRST_PERSON for w in words(s)):
            return True
    return False


def gate_score(extrinsic: float, intrinsic: float, w_intrinsic: float) -> float:
    """The one gate score: max(extrinsic, w * intrinsic).

    Why max and not a sum: a reward-driven stream (w = 0) routes by the
    extrinsic score alone, bit for bit; a reward-free one (extrinsic = 0) routes by intrinsic
    surprise alone; in between, a transition is kept if either channel finds it
    surprising, and neither channel's scale dilutes the other's. ``w`` comes from
    the agent's `RewardMix` (it adapts to how much of its stream carries rewards).
    """
    return max(float(extrinsic), float(w_intrinsic) * float(intrinsic))


class RewardMix:
    """w_intrinsic = max(0, 1 - rate / rate_full): rewards switch intrinsic surprise off.

    ``rate`` is the decayed share of one agent's transitions with a non-zero
    reward (exact mean for the first 1/alpha, then EMA with horizon ~1/alpha).
    A Gymnasium or ScienceWorld stream pays or costs reward on many steps (rate
    far above ``rate_full`` = 1 %), so w = 0 and routing is the extrinsic RPE's
    alone; a chat publishes reward 0 (its thumbs arrive as `Feedback` and
    become credit, not transition rewards), so w = 1. The batch's rewards are
    folded in before w is read, so an agent's first batch is already judged.
    One per agent (`AgentRewardMix`).
    """

    def __init__(self, alpha: float = 0.002, rate_full: float = 0.01) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if not rate_full > 0.0:
            raise ValueError(f"rate_full must be > 0, got {rate_full}")
        self.alpha = float(alpha)
        self.rate_full = float(rate_full)
        self.rate = 0.0
        self.count = 0

    def observe(self, rewards: np.ndarray) -> float:
        """Fold the batch's rewards in; return the intrinsic weight for this batch."""
        for nz in (np.asarray(rewards, dtype=np.float64).reshape(-1) != 0.0).tolist():
            self.count += 1
            self.rate += max(1.0 / self.count, self.alpha) * (float(nz) - self.rate)
        return self.weight

    @property
    def weight(self) -> float:
        return max(0.0, 1.0 - self.rate / self.rate_full)

    def to_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "rate_full": self.rate_full,
            "rate": self.rate,
            "count": self.count,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RewardMix:
        m = cls(alpha=float(d["alpha"]), rate_full=float(d["rate_full"]))
        m.rate = float(d["rate"])
        m.count = int(d["count"])
        return m


class AgentRewardMix:
    """One `RewardMix` per agent: a transition's w_intrinsic is its own agent's.

    One tenant may hold chats and rewarded agents side by side: a chat agent
    publishes reward 0, so its w stays 1 whatever the tenant's other agents earn,
    and a rewarded agent's w falls to 0. Bounded to the
    ``max_agents`` most recently seen agents; an agent seen for the first time (or
    again after eviction) starts at w = 1, as a new tenant does, and the rewards of
    its first batch are folded in before its w is read.
    """

    def __init__(
        self, alpha: float = 0.002, rate_full: float = 0.01, max_agents: int = 4096
    ) -> None:
        RewardMix(alpha, rate_full)  # validates the knobs
        if max_agents < 1:
            raise ValueError(f"max_agents must be >= 1, got {max_agents}")
        self.alpha, self.rate_full, self.max_agents = alpha, rate_full, max_agents
        self.mixes: OrderedDict[str, RewardMix] = OrderedDict()

    def _of(self, agent: str) -> RewardMix:
        return _bounded(
            self.mixes, agent, lambda: RewardMix(self.alpha, self.rate_full), self.max_agents
        )

    def observe(self, agents: Sequence[str], rewards: np.ndarray) -> np.ndarray:
        """Fold each transition's reward into its agent's rate, then w per transition."""
        r = np.asarray(rewards, dtype=np.float64).reshape(-1)
        if len(agents) != r.size:
            raise ValueError("one reward per agent entry")
        rows: dict[str, list[int]] = {}  # each agent once, in order of appearance
        for i, a in enumerate(agents):
            rows.setdefault(a, []).append(i)
        # each agent's w as its rewards are folded in: a batch of more agents than
        # ``max_agents`` evicts its own first ones from the map, not from the answer
        w = {a: self._of(a).observe(r[idx]) for a, idx in rows.items()}
        return np.asarray([w[a] for a in agents], dtype=np.float64)

    def weight(self, agent: str) -> float:
        """The agent's current w (1 for an agent not seen yet)."""
        m = self.mixes.get(agent)
        return 1.0 if m is None else m.weight

    def set_rate_full(self, rate_full: float) -> None:
        RewardMix(self.alpha, rate_full)
        self.rate_full = rate_full
        for m in self.mixes.values():
            m.rate_full = rate_full

    def to_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "rate_full": self.rate_full,
            "max_agents": self.max_agents,
            "agents": {a: [m.rate, m.count] for a, m in self.mixes.items()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AgentRewardMix:
        out = cls(float(d["alpha"]), float(d["rate_full"]), int(d["max_agents"]))
        for a, (rate, count) in d["agents"].items():
            m = out._of(str(a))
            m.rate, m.count = float(rate), int(count)
        return out


def _body(text: str) -> tuple[str, int]:
    """``text`` after its ``"speaker: "`` prefix, and how many tokens that prefix has."""
    m = SPEAKER_PREFIX.match(text)
    if m is None:
        return text, 0
    return text[m.end() :], len(words(text[: m.end()]))


class TokenSurprisal:
    """Online unigram model over hashed tokens; surprisal of a text in nats."""

    def __init__(
        self, buckets: int = 1 << 14, smoothing: float = 0.5, n0: float | None = None
    ) -> None:
        if buckets < 2 or smoothing <= 0:
            raise ValueError("buckets must be >= 2 and smoothing > 0")
        if n0 is not None and not (math.isfinite(n0) and n0 >= 0.0):
            raise ValueError(f"n0 must be a finite number >= 0 or None, got {n0}")
        self.buckets = int(buckets)
        self.smoothing = float(smoothing)
        #: None: the summed surprisal; a number: ``sum / (n + n0)``, the surprisal per
        #: token shrunk towards 0 for turns of a few tokens (`surprisal`)
        self.n0 = n0
        self.counts = np.zeros(self.buckets, dtype=np.float32)
        self.total = 0.0

    def ids(self, text: str) -> np.ndarray:
        n = self.buckets
        return np.asarray([_fnv1a(t) % n for t in words(text)], dtype=np.int64)

    def token_surprisals(self, ids: np.ndarray) -> np.ndarray:
        """-log p(token) of each id under the counts so far (decide before learning)."""
        a = self.smoothing
        p = (self.counts[ids].astype(np.float64) + a) / (self.total + a * self.buckets)
        return -np.log(p)

    def summed(self, ids: np.ndarray) -> float:
        """Sum of -log p(token) under the counts so far (decide before learning)."""
        if ids.size == 0:
            return 0.0
        return float(self.token_surprisals(ids).sum())

    def best_sentence(self, text: str, ids: np.ndarray) -> float:
        """The information term (`scaled`) of the most informative sentence of
        ``text`` (after a ``"speaker: "`` prefix); ``ids`` are ``text``'s token ids.

        Why: per token, a long answer that states one specific fact among generic
        sentences ("Of the 23 games, 12 were played at Arrowhead") is diluted by them;
        its best sentence is not. A one-sentence turn is its own best sentence.
        """
        if ids.size == 0:
            return 0.0
        body, lo = _body(text)
        s = self.token_surprisals(ids)
        best = 0.0
        for sentence in _SENTENCE.findall(body):
            n = len(words(sentence))
            if n:
                best = max(best, self.scaled(float(s[lo : lo + n].sum()), n))
                lo += n
        return best

    def scaled(self, total: float, n: int) -> float:
        """The information term from a summed surprisal over ``n`` tokens: the sum, or
        per token, ``sum / (n + n0)``, when ``n0`` is set.

        Why per token for utterances: summed surprisal grows with length, so it ranks
        a verbose speaker's long answers above a terse one's disclosures ("I moved to
        Lisbon"); per token it measures how specific the words are. ``n0`` tokens of
        shrinkage keep a one-word turn with one rare token from outranking a sentence.
        """
        return total if self.n0 is None else total / (n + self.n0)

    def surprisal(self, ids: np.ndarray) -> float:
        """The information term of a text's token ids (`scaled` of `summed`)."""
        return self.scaled(self.summed(ids), int(ids.size))

    def learn(self, ids: np.ndarray) -> None:
        np.add.at(self.counts, ids, 1.0)
        self.total += float(ids.size)
        if ids.size and float(self.counts[ids].max()) > MAX_COUNT:
            # halve everything: probabilities unchanged, old text weighs less, and
            # counts stay exact enough in float16 for the checkpoint
            self.counts *= 0.5
            self.total *= 0.5

    def to_dict(self) -> dict[str, Any]:
        # float16 (counts stay below MAX_COUNT): 32 KB for 2^14 buckets
        return {
            "buckets": self.buckets,
            "smoothing": self.smoothing,
            "n0": self.n0,
            "total": self.total,
            "counts_b64": base64.b64encode(self.counts.astype(np.float16).tobytes()).decode(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TokenSurprisal:
        n0 = d.get("n0")
        t = cls(
            buckets=int(d["buckets"]),
            smoothing=float(d["smoothing"]),
            n0=None if n0 is None else float(n0),
        )
        raw = np.frombuffer(base64.b64decode(d["counts_b64"]), dtype=np.float16)
        t.counts = raw.astype(np.float32)
        if t.counts.shape != (t.buckets,):
            raise ValueError("token counts do not match the bucket count")
        t.total = float(d["total"])
        return t


def _net(dim: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, out))


class RndSurprise:
    """Random network distillation: error of a trained net imitating a fixed random one.

    The target net is rebuilt from ``seed`` (never stored); the predictor is
    trained online by SGD on every batch after scoring it (decide, then learn),
    so embeddings from regions seen often score low. Plain SGD: no optimiser
    state to checkpoint.
    """

    def __init__(
        self, dim: int, hidden: int = 64, out: int = 32, lr: float = 0.05, seed: int = 0
    ) -> None:
        if dim <= 0 or hidden <= 0 or out <= 0 or lr <= 0:
            raise ValueError("dim, hidden, out and lr must be positive")
        self.dim, self.hidden, self.out, self.lr, self.seed = dim, hidden, out, lr, seed
        g = torch.Generator().manual_seed(seed)
        self.target = _net(dim, hidden, out)
        self.predictor = _net(dim, hidden, out)
        with torch.no_grad():
            for net in (self.target, self.predictor):
                for p in net.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(max(p.shape[-1], 1)))
        self.target.requires_grad_(False)
        self.updates = 0

    def errors(self, x: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.asarray(x, dtype=np.float32))
        with torch.no_grad():
            return ((self.predictor(t) - self.target(t)) ** 2).sum(1).numpy().astype(np.float64)

    def learn(self, x: np.ndarray) -> None:
        t = torch.from_numpy(np.asarray(x, dtype=np.float32))
        loss = ((self.predictor(t) - self.target(t)) ** 2).sum(1).mean()
        self.predictor.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for p in self.predictor.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-self.lr)
        self.updates += 1

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "dim": self.dim,
            "hidden": self.hidden,
            "out": self.out,
            "lr": self.lr,
            "seed": self.seed,
            "updates": self.updates,
        }
        if self.updates:  # an untrained predictor is rebuilt from the seed
            buf = io.BytesIO()
            torch.save({k: v.half() for k, v in self.predictor.state_dict().items()}, buf)
            d["predictor_b64"] = base64.b64encode(buf.getvalue()).decode()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RndSurprise:
        r = cls(
            dim=int(d["dim"]),
            hidden=int(d["hidden"]),
            out=int(d["out"]),
            lr=float(d["lr"]),
            seed=int(d["seed"]),
        )
        r.updates = int(d.get("updates", 0))
        if "predictor_b64" in d:
            sd = torch.load(
                io.BytesIO(base64.b64decode(d["predictor_b64"])),
                map_location="cpu",
                weights_only=True,
            )
            r.predictor.load_state_dict({k: v.float() for k, v in sd.items()})
        return r


@dataclass(frozen=True)
class IntrinsicConfig:
    """Validated knobs of the intrinsic score (defaults documented in the module)."""

    repeat_cos: float = 0.9
    fit_k: float = 0.0
    fit_exempt: float = 3.0
    window: int = 4
    lookahead: int = 4
    bank_min: float = 0.5
    bank_per_agent: int = 512
    max_agents: int = 4096
    stats_alpha: float = 0.01
    warmup: int = 20
    reward_rate_full: float = 0.01
    #: the information term per token with this many tokens of shrinkage
    #: (`TokenSurprisal.surprisal`); None: summed over the tokens
    info_n0: float | None = 4.0
    #: the information of a text: (1 - w) x the whole text's per-token term + w x its
    #: most informative sentence's (`TokenSurprisal.best_sentence`; 0: the whole text
    #: only; with ``info_n0`` None, the summed term, it does not apply)
    sentence_weight: float = 0.5
    #: how far each speaker of a chat (the ``"speaker: "`` prefix of a turn) is judged
    #: against its own typical turn: the information is divided by that speaker's
    #: running mean to this power (0: one yardstick for every speaker; 1: each speaker
    #: only against itself). Between the two, a verbose speaker cannot crowd out a
    #: terse one, and a speaker whose turns are all informative still keeps more.
    speaker_pooling: float = 0.5
    #: a turn in which its speaker states something about itself (`discloses`)
    #: carries ``1 + disclosure`` times its information, over its speaker's mean
    #: factor (`IntrinsicState._disclosed`; 0: off)
    disclosure: float = 0.3
    #: speakers (the ``"speaker: "`` prefix, any case) whose first-person sentences are
    #: never disclosures (`discloses`): programs, not people
    machine_speakers: tuple[str, ...] = MACHINE_SPEAKERS
    #: a written turn whose nearest memory of the same agent (by the guard's similarity,
    #: meaning and words) is this many standard deviations above the unrelated level
    #: speaks of the same thing: it updates that memory (`IntrinsicScore.updates`), and a
    #: search ranks it above the older one
    update_k: float = 3.0
    #: where a near-repeat is discounted: "episode" (a chat session) against the
    #: agent's memories of the same episode only, so a restatement in a later session
    #: (a change or a confirmation of state) is judged on its information; "agent":
    #: against all of the agent's memories
    repeat_scope: str = "episode"
    #: contamination-adaptive cut (`Contamination`): off-context where the posterior
    #: of "injected" exceeds this; 0.9 = only when injected is at least nine times as
    #: likely as real (losing a real turn is worse than keeping a distractor, and the
    #: estimate of the injected share runs high on a clean chat); 1 = off
    off_posterior: float = 0.9
    #: the guard's similarity of two turns: (1 - lexical) x the cosine of their
    #: embeddings + lexical x the cosine of their words (`IntrinsicState.lexical`,
    #: each distinct word weighted by its surprisal); 0: embeddings only
    lexical: float = 0.5
    #: turns written before the guard had its yardstick (the unrelated level and the
    #: contamination estimate still warming up) are judged again by the warm guard once
    #: their window is complete; those it vetoes then are retracted
    #: (`IntrinsicScore.retracts`); False: the cold guard's call is final
    recheck_cold: bool = False
    hist_bins: int = 40
    hist_alpha: float = 0.002
    hist_warmup: int = 100

    def __post_init__(self) -> None:
        # one spelling (a checkpoint's JSON gives a list): matched in lower case
        object.__setattr__(self, "machine_speakers", machine_speaker_names(self.machine_speakers))
        if not 0.0 < self.repeat_cos < 1.0:
            raise ValueError(f"repeat_cos must be in (0, 1), got {self.repeat_cos}")
        if not all(math.isfinite(v) for v in (self.fit_k, self.bank_min)):
            raise ValueError("fit_k and bank_min must be finite")
        if not self.fit_exempt > 0.0:
            raise ValueError(f"fit_exempt must be > 0 (or inf), got {self.fit_exempt}")
        if not 0.0 < self.stats_alpha <= 1.0:
            raise ValueError("stats_alpha must be in (0, 1]")
        if not 0.0 < self.reward_rate_full <= 1.0:
            raise ValueError(f"reward_rate_full must be in (0, 1], got {self.reward_rate_full}")
        if self.bank_per_agent < 1 or self.max_agents < 1 or self.warmup < 0:
            raise ValueError("bank_per_agent, max_agents >= 1 and warmup >= 0")
        if self.window < 1 or self.lookahead < 0:
            raise ValueError("window must be >= 1 and lookahead >= 0")
        if self.info_n0 is not None and not (math.isfinite(self.info_n0) and self.info_n0 >= 0.0):
            raise ValueError(f"info_n0 must be a finite number >= 0 or None, got {self.info_n0}")
        if not (math.isfinite(self.sentence_weight) and 0.0 <= self.sentence_weight <= 1.0):
            raise ValueError(f"sentence_weight must be in [0, 1], got {self.sentence_weight}")
        if not (math.isfinite(self.speaker_pooling) and 0.0 <= self.speaker_pooling <= 1.0):
            raise ValueError(f"speaker_pooling must be in [0, 1], got {self.speaker_pooling}")
        if self.repeat_scope not in ("episode", "agent"):
            raise ValueError(f"repeat_scope must be 'episode' or 'agent': {self.repeat_scope!r}")
        if not (math.isfinite(self.disclosure) and self.disclosure >= 0.0):
            raise ValueError(f"disclosure must be a finite number >= 0, got {self.disclosure}")
        if not (math.isfinite(self.update_k) and self.update_k >= 0.0):
            raise ValueError(f"update_k must be a finite number >= 0, got {self.update_k}")
        if not (math.isfinite(self.lexical) and 0.0 <= self.lexical <= 1.0):
            raise ValueError(f"lexical must be in [0, 1], got {self.lexical}")
        if not 0.0 < self.off_posterior <= 1.0:
            raise ValueError(f"off_posterior must be in (0, 1], got {self.off_posterior}")
        if self.hist_bins < 4 or not 0.0 < self.hist_alpha <= 1.0 or self.hist_warmup < 0:
            raise ValueError("hist_bins >= 4, hist_alpha in (0, 1], hist_warmup >= 0")


@dataclass(frozen=True)
class GuardCalibration:
    """The context guard's strictness for one encoder: ``recheck_cold`` and
    ``off_posterior`` of `IntrinsicConfig`."""

    recheck_cold: bool = False
    off_posterior: float = 0.9

    def __post_init__(self) -> None:
        if not 0.0 < self.off_posterior <= 1.0:
            raise ValueError(f"off_posterior must be in (0, 1], got {self.off_posterior}")


#: The guard's calibration per encoder, where it differs from the default (a second
#: look off, posterior 0.9). How far the contamination estimate can be trusted depends
#: on how well the encoder tells a turn's context from unrelated turns: on clean LoCoMo
#: it reads an injected share of 0.07-0.44 with torch MiniLM and 0.32-0.58 with
#: ``minilm-static`` (the truth is 0). With MiniLM the second look at posterior 0.75
#: costs a clean chat 0.007 of recall and cuts the noise kept from 0.28 to 0.17; with
#: ``minilm-static`` it costs 0.07 (docs/design/2026-12-04-guard-per-encoder.md). An
#: encoder not named here gets the default. ``DMEM_INTRINSIC__RECHECK_COLD`` and
#: ``DMEM_INTRINSIC__OFF_POSTERIOR`` override it.
GUARD_BY_ENCODER: dict[str, GuardCalibration] = {
    "minilm": GuardCalibration(recheck_cold=True, off_posterior=0.75),
}


def guard_calibration(encoder: str) -> GuardCalibration:
    """The guard's calibration for the encoder named ``encoder`` (`GUARD_BY_ENCODER`)."""
    return GUARD_BY_ENCODER.get(encoder, GuardCalibration())


@dataclass(frozen=True)
class IntrinsicScore:
    """One transition's intrinsic surprise and its parts (stored with the memory)."""

    score: float  # info * novelty factor / mean info; 0 when off-context
    info: float  # surprisal in nats (or RND error for vectors)
    novelty: float  # 1 - max cosine to the agent's bank (1 if none)
    fit: float  # max cosine to the last `window` turns and the next observation
    off_context: bool
    raw: float = 0.0  # the score before an off-context veto (what a vindication routes by)
    #: (memory id, raw score, embedding) of earlier off-context suspects this turn
    #: refers back to: the veto was wrong, the write path routes them by ``raw``
    vindicates: tuple[tuple[str, float, np.ndarray], ...] = ()
    #: the memory id of the agent's earlier memory this turn speaks of (nearest in the
    #: bank, at least ``update_k`` std above the unrelated level), if any
    updates: str | None = None
    #: the speaker states something about itself (`discloses`; weighed by ``disclosure``)
    disclosure: bool = False
    #: (memory id, episode id) of earlier turns of this agent that passed the guard while
    #: it was cold and that the warm guard, their window now complete, judges
    #: off-context (``recheck_cold``): the write path retracts those it wrote
    retracts: tuple[tuple[str, str | None], ...] = ()
    #: this turn went on probation (``recheck_cold``): if the write path does not write
    #: it on the intrinsic score's account, it tells the state so (`IntrinsicState.release`)
    on_probation: bool = False


@dataclass
class _Probation:
    """A turn judged while the guard was cold, waiting for its window to complete and
    for the warm guard to judge it again (``recheck_cold``)."""

    memory_id: str
    vec: np.ndarray
    fit: float  # the best similarity so far: the window before it, then the turns after
    left: int  # later turns of the agent still to see
    episode: str | None = None
    lex: np.ndarray | None = None


@dataclass
class _Suspect:
    """A turn vetoed as off-context, waiting `lookahead` turns for one that refers to it."""

    memory_id: str
    vec: np.ndarray
    raw: float
    threshold: float
    left: int
    episode: str | None = None
    lex: np.ndarray | None = None


_W = TypeVar("_W", "_Suspect", "_Probation")

#: agents whose pending suspects a checkpoint keeps (the most recent ones)
SUSPECT_AGENTS = 256
#: turns on probation a tenant's state keeps (`IntrinsicState._recheck`): the guard is
#: cold for about its warm-up's turns of a tenant (a tenant of short conversations may
#: never warm up); the oldest beyond this are let through
PROBATION_MAX = 1024


def _b64(x: np.ndarray | None) -> str | None:
    return None if x is None else base64.b64encode(x.astype("<f4").tobytes()).decode()


def _unb64(x: str | None) -> np.ndarray | None:
    return None if x is None else np.frombuffer(base64.b64decode(x), dtype="<f4").copy()


def _waiting_to_dict(x: _Suspect | _Probation) -> dict[str, Any]:
    """A turn waiting in the intrinsic state (a suspect or a turn on probation) as
    JSON: its fields by name (the memory id as ``id``), vectors as base64 float32."""
    d = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
    d["id"] = d.pop("memory_id")
    d["vec"], d["lex"] = _b64(x.vec), _b64(x.lex)
    return d


def _waiting_from_dict(cls: type[_W], d: dict[str, Any]) -> _W:
    """The inverse of `_waiting_to_dict`; ``left`` is a count, other numbers floats."""
    vec = _unb64(d["vec"])
    assert vec is not None
    kw: dict[str, Any] = {"memory_id": str(d["id"]), "vec": vec, "lex": _unb64(d.get("lex"))}
    kw["episode"] = None if d.get("episode") is None else str(d["episode"])
    for f in dataclasses.fields(cls):
        if f.name not in kw:
            kw[f.name] = int(d[f.name]) if f.name == "left" else float(d[f.name])
    return cls(**kw)


class _Running:
    """EMA of a value with an exact mean for the first 1/alpha samples."""

    def __init__(self, alpha: float) -> None:
        self.alpha, self.mean, self.count = alpha, 0.0, 0

    def add(self, x: float) -> None:
        self.count += 1
        self.mean += max(1.0 / self.count, self.alpha) * (x - self.mean)


class Contamination:
    """How much of the stream is off-context, and the fit below which a turn probably is.

    Two decayed histograms (horizon ~1 / ``hist_alpha`` turns, 500 by default: the
    size of the agent's bank) of fits in std units of the unrelated level, (fit -
    mean) / std: the observed fit of every judged turn (the statistic the guard
    decides by: best cosine to the ``window`` turns before it and the ``lookahead``
    turns after it, counted once they have arrived), and a null draw per turn (its
    best cosine to a run of as many consecutive older memories of the agent: the fit
    the same turn would have had in an unrelated window of this conversation). The
    share of off-context turns is Storey's estimate, pi0 = F_obs(m) / F_null(m) at the
    null median m (a real turn rarely fits worse than the median unrelated window,
    so the excess mass down there is off-context turns), capped at 1; the posterior
    that a turn with fit z is off-context is pi0 f_null(z) / f_obs(z) (Efron's local
    false discovery rate). `cut` is where that posterior falls to ``off_posterior``,
    coming down from the top (linear between bin centres). The guard vetoes below
    max(``fit_k``, cut): in a clean stream pi0 is small, the cut sits below ``fit_k``
    and changes nothing; in a contaminated one it rises with the contamination.
    """

    #: the range the histograms cover, in std of the unrelated level above its mean
    LO, HI = -4.0, 6.0

    def __init__(self, bins: int, alpha: float, warmup: int) -> None:
        self.bins, self.alpha, self.warmup = int(bins), float(alpha), int(warmup)
        self.obs = np.zeros(self.bins)
        self.null = np.zeros(self.bins)
        self.count = 0
        #: null draws seen (a draw needs a bank of older memories, so it starts later
        #: than the observed fits and the warm-up must count it on its own)
        self.null_count = 0

    def _bin(self, x: float) -> int:
        return min(self.bins - 1, max(0, int((x - self.LO) / (self.HI - self.LO) * self.bins)))

    def add(self, fit: float, null: float | None) -> None:
        self.count += 1
        a = max(1.0 / self.count, self.alpha)
        self.obs *= 1.0 - a
        self.obs[self._bin(fit)] += a
        if null is not None:
            self.null_count += 1
            b = max(1.0 / self.null_count, self.alpha)
            self.null *= 1.0 - b
            self.null[self._bin(null)] += b

    def pi0(self) -> float:
        n0 = self.null.sum()
        if n0 <= 0.0 or self.obs.sum() <= 0.0:
            return 0.0
        c0 = np.cumsum(self.null) / n0
        m = int(np.searchsorted(c0, 0.5))  # the bin holding the null median
        co = float(np.cumsum(self.obs)[m] / self.obs.sum())
        return min(1.0, co / max(float(c0[m]), 1e-9))

    @property
    def warm(self) -> bool:
        """Enough observed fits and null draws for `cut` to estimate anything."""
        return self.null_count > 0 and min(self.count, self.null_count) >= self.warmup

    def cut(self, posterior: float) -> float:
        """The fit below which a turn is off-context (-inf until warmed up)."""
        if posterior >= 1.0 or not self.warm:
            return -math.inf  # 1 switches the cut off
        pi0 = self.pi0()
        if pi0 <= 0.0:
            return -math.inf
        # densities with half a count of smoothing per bin at the warm-up's scale
        eps = 0.5 / max(self.warmup, 1)
        f0 = self.null / self.null.sum() + eps
        f = self.obs / self.obs.sum() + eps
        lfdr = pi0 * f0 / f
        # from the top down, over the bins that hold observed fits: a bin holding less
        # than the smoothing (half a count at the warm-up's scale; decayed counts never
        # reach 0, so a bin hit once long ago would otherwise count forever) says
        # nothing; the cut is the upper edge of the first bin whose posterior is high
        held = self.obs / self.obs.sum() >= eps
        edge = self.bins
        while edge > 0 and (lfdr[edge - 1] <= posterior or not held[edge - 1]):
            edge -= 1
        if edge == 0:
            return -math.inf
        # where the posterior crosses ``posterior``: linear between the centres of the
        # last bin above it and the next one (the bin's upper edge would be up to a
        # bin width too strict)
        w = (self.HI - self.LO) / self.bins
        i = edge - 1
        centre = self.LO + (i + 0.5) * w
        if i + 1 >= self.bins:
            return centre
        hi, lo = float(lfdr[i]), float(lfdr[i + 1])
        if lo > posterior or lo >= hi:  # the bin above is empty: its upper edge
            return centre + 0.5 * w
        return centre + w * (hi - posterior) / (hi - lo)

    def to_dict(self) -> dict[str, Any]:
        return {
            "obs": self.obs.round(6).tolist(),
            "null": self.null.round(6).tolist(),
            "count": self.count,
            "null_count": self.null_count,
        }

    def load(self, d: dict[str, Any]) -> None:
        obs, null = np.asarray(d["obs"], float), np.asarray(d["null"], float)
        if obs.shape == self.obs.shape and null.shape == self.null.shape:
            self.obs, self.null, self.count = obs, null, int(d["count"])
            # a checkpoint without the separate count: every judged turn had its draw
            self.null_count = int(d.get("null_count", d["count"]))


def _bounded(d: OrderedDict[str, Any], agent: str, make: Any, limit: int) -> Any:
    """``d[agent]`` (created by ``make``), most recent last, at most ``limit`` agents."""
    v = d.get(agent)
    if v is None:
        v = make()
        d[agent] = v
        while len(d) > limit:
            d.popitem(last=False)
    d.move_to_end(agent)
    return v


class IntrinsicState:
    """Per-tenant intrinsic-surprise state (see module docstring for what is checkpointed)."""

    def __init__(self, dim: int, config: IntrinsicConfig | None = None, seed: int = 0) -> None:
        self.dim = int(dim)
        self.config = config or IntrinsicConfig()
        self.tokens = TokenSurprisal(n0=self.config.info_n0)
        self.rnd = RndSurprise(self.dim, seed=seed)
        self.mix = AgentRewardMix(
            rate_full=self.config.reward_rate_full, max_agents=self.config.max_agents
        )
        a = self.config.stats_alpha
        self.info_mean = _Running(a)  # mean information of a scored turn
        self.total_mean = _Running(a)  # mean summed information (the guard's exemption)
        self.unrel_mean = _Running(a)  # mean cosine turn <-> a bank memory
        self.unrel_sq = _Running(a)  # mean squared cosine (for the std)
        #: per agent and speaker ("agent\x1fspeaker"): mean information of its turns
        self.speakers: OrderedDict[str, _Running] = OrderedDict()
        #: per agent and speaker: mean disclosure factor of its turns (`_disclosed`)
        self.disclosures: OrderedDict[str, _Running] = OrderedDict()
        self.bank: OrderedDict[str, deque[np.ndarray]] = OrderedDict()
        #: beside ``bank``: each entry's (memory id, episode id), either may be unknown
        self.bank_meta: OrderedDict[str, deque[tuple[str | None, str | None]]] = OrderedDict()
        self.recent: OrderedDict[str, deque[np.ndarray]] = OrderedDict()
        #: beside ``bank`` and ``recent``: each turn's word vector (`lexical`; None for
        #: a turn without text)
        self.lex_bank: OrderedDict[str, deque[np.ndarray | None]] = OrderedDict()
        self.lex_recent: OrderedDict[str, deque[np.ndarray | None]] = OrderedDict()
        self.suspects: OrderedDict[str, list[_Suspect]] = OrderedDict()
        #: per agent: turns that passed the guard while it was cold (`_recheck`)
        self.probation: OrderedDict[str, deque[_Probation]] = OrderedDict()
        c = self.config
        self.contamination = Contamination(c.hist_bins, c.hist_alpha, c.hist_warmup)
        self._rng = np.random.default_rng(seed)
        #: per agent: [vec, best cosine so far, null draw, later turns still to see,
        #: the unrelated level's mean and std when it was judged]
        self.pending: OrderedDict[str, deque[list[Any]]] = OrderedDict()

    # ------------------------------------------------------------------ parts
    def _agent_bank(self, agent: str) -> np.ndarray | None:
        dq = self.bank.get(agent)
        if not dq:
            return None
        return np.stack(list(dq))

    def lexical(self, text: str | None, ids: np.ndarray | None = None) -> np.ndarray | None:
        """The words of ``text`` (after a ``"speaker: "`` prefix) as a unit vector of
        `LEX_DIM` folded token buckets, each distinct word weighted by its surprisal
        under the tenant's token counts: two turns share rare words, not "the" and
        "that". None without text, a text without words, or with ``lexical`` 0.

        Why words beside the embedding: a turn pasted from another conversation can
        be as close in meaning to its neighbours as a real reply (both are small talk
        about family and work), but it rarely repeats their names, places and
        objects; the context guard's fit separates them better with both. ``ids``:
        ``text``'s token ids when the caller has them (not tokenised again).
        """
        if text is None or self.config.lexical <= 0.0:
            return None
        body, lo = _body(text)
        words = np.unique(self.tokens.ids(body) if ids is None else ids[lo:])
        if words.size == 0:
            return None
        w = self.tokens.token_surprisals(words)
        out = np.zeros(LEX_DIM, dtype=np.float32)
        np.add.at(out, words % LEX_DIM, w.astype(np.float32))
        n = float(np.linalg.norm(out))
        return out / n if n > 0.0 else None

    def _sim(
        self, a: np.ndarray, la: np.ndarray | None, b: np.ndarray, lb: np.ndarray | None
    ) -> float:
        """The guard's similarity of two turns (`IntrinsicConfig.lexical`): the
        embeddings' cosine, mixed with the word vectors' where both turns have words."""
        c = float(a @ b)
        if la is None or lb is None:
            return c
        w = self.config.lexical
        return (1.0 - w) * c + w * float(la @ lb)

    def _bank_sim(self, agent: str, cos: np.ndarray, lex: np.ndarray | None) -> np.ndarray:
        """`_sim` of a turn to each memory of ``agent``'s bank, from its cosines."""
        lb = self.lex_bank.get(agent)
        if lex is None or not lb or len(lb) != cos.size:
            return cos
        has = np.fromiter((v is not None for v in lb), dtype=bool, count=cos.size)
        if not has.any():
            return cos
        lx = np.zeros(cos.size, dtype=np.float64)
        lx[has] = np.stack([v for v in lb if v is not None]) @ lex  # one product, not one a memory
        return self._mix(cos, lx, has)

    def _mix(self, cos: np.ndarray, lex: np.ndarray, has: np.ndarray) -> np.ndarray:
        """`_sim` elementwise: the cosines mixed with the word cosines where ``has``."""
        w = self.config.lexical
        return np.where(has, (1.0 - w) * cos + w * lex, cos)

    def stored(
        self,
        agent: str,
        vec: np.ndarray,
        memory_id: str | None = None,
        episode: str | None = None,
        lex: np.ndarray | None = None,
    ) -> None:
        """Add ``vec`` (the memory ``memory_id`` of ``episode``) to ``agent``'s bank
        (novelty and the unrelated level are measured against it). `score_batch` adds
        every turn it rates as a memory itself."""
        cfg = self.config
        dq = _bounded(self.bank, agent, lambda: deque(maxlen=cfg.bank_per_agent), cfg.max_agents)
        dq.append(np.asarray(vec, dtype=np.float32).copy())
        dm = _bounded(
            self.bank_meta, agent, lambda: deque(maxlen=cfg.bank_per_agent), cfg.max_agents
        )
        dm.append((memory_id, episode))
        dl = _bounded(
            self.lex_bank, agent, lambda: deque(maxlen=cfg.bank_per_agent), cfg.max_agents
        )
        dl.append(lex)

    def _unrelated(self) -> tuple[float, float] | None:
        if self.unrel_mean.count < self.config.warmup:
            return None
        mu = self.unrel_mean.mean
        var = max(self.unrel_sq.mean - mu * mu, 0.0)
        return mu, math.sqrt(var)

    def _cold_unrelated(self, agent: str) -> tuple[float, float] | None:
        """The unrelated level before the running one is warm (a tenant's first
        ``warmup`` turns), from the pairs of ``agent``'s bank: the mean and standard
        deviation of the guard's similarity between its memories, near-repeats left
        out. Pairs spread wider than the running level's per-turn means, so the bar is
        stricter, not looser, while it is cold; None below ``COLD_PAIRS`` pairs."""
        bank, lb = self.bank.get(agent), self.lex_bank.get(agent)
        if not bank or lb is None or len(lb) != len(bank) or len(bank) < 2:
            return None
        b = np.stack(list(bank)).astype(np.float64)
        g = c = b @ b.T
        has = np.fromiter((v is not None for v in lb), dtype=bool, count=len(lb))
        if has.any():
            lx = np.zeros_like(c)
            idx = np.flatnonzero(has)
            lv = np.stack([v for v in lb if v is not None]).astype(np.float64)
            lx[np.ix_(idx, idx)] = lv @ lv.T
            g = self._mix(c, lx, has[:, None] & has[None, :])
        iu = np.triu_indices(len(bank), k=1)
        far = g[iu][c[iu] < self.config.repeat_cos]
        if far.size < COLD_PAIRS:
            return None
        return float(far.mean()), float(far.std())

    def _vindicated(self, agent: str, vec: np.ndarray, lex: np.ndarray | None) -> list[_Suspect]:
        """Suspects of ``agent`` that ``vec`` refers back to (they leave the list), and
        one turn less for the others (those with none left are dropped for good)."""
        pend = self.suspects.get(agent)
        if not pend:
            return []
        hit, keep = [], []
        for sus in pend:
            if self._sim(sus.vec, sus.lex, vec, lex) >= sus.threshold:
                hit.append(sus)
            elif sus.left > 1:
                sus.left -= 1
                keep.append(sus)
        self.suspects[agent] = keep
        return hit

    def _recheck(
        self, agent: str, vec: np.ndarray, lex: np.ndarray | None
    ) -> tuple[tuple[str, str | None], ...]:
        """Turns of ``agent`` on probation that the warm guard now judges off-context.

        This turn extends each waiting turn's window (its similarity to them), then,
        once the guard is warm (the unrelated level and the contamination estimate
        both have their warm-up), every turn whose window is complete is judged as a
        live turn is now: off-context if its best similarity to the ``window`` turns
        before it, its next observation and the ``lookahead`` turns after it is below
        today's threshold; a retracted turn also leaves the bank. Why: the first turns
        of a tenant pass a guard without a yardstick (on LoCoMo with noise 0.5, 43 % of
        the injected turns stored are among each conversation's first 150 turns); the
        cold guard's pass is provisional.
        """
        pend = self.probation.get(agent)
        if not pend:
            return ()
        for p in pend:
            if p.left > 0:
                p.fit = max(p.fit, self._sim(p.vec, p.lex, vec, lex))
                p.left -= 1
        unrel = self._unrelated()
        if unrel is None or not self.contamination.warm or pend[0].left > 0:
            return ()
        cfg = self.config
        k = max(cfg.fit_k, self.contamination.cut(cfg.off_posterior))
        threshold = unrel[0] + k * unrel[1]
        out = []
        while pend and pend[0].left <= 0:  # appended in order: complete in order
            p = pend.popleft()
            if p.fit < threshold:
                out.append((p.memory_id, p.episode))
                self._unbank(agent, p.memory_id)  # no longer a memory to measure against
        return tuple(out)

    def _on_probation(self, agent: str, entry: _Probation) -> None:
        """Put ``entry`` on ``agent``'s probation; beyond `PROBATION_MAX` for the whole
        state, the oldest agent's oldest turns are let through."""
        pq = _bounded(self.probation, agent, deque, self.config.max_agents)
        pq.append(entry)
        over = self.probation_size - PROBATION_MAX
        while over > 0:
            oldest = next(iter(self.probation))
            q = self.probation[oldest]
            if q:
                q.popleft()
                over -= 1
            if not q:
                del self.probation[oldest]

    @property
    def probation_size(self) -> int:
        """Turns on probation over all agents."""
        return sum(len(q) for q in self.probation.values())

    def probation_ids(self) -> list[str]:
        """The memory ids of the turns on probation, over all agents."""
        return [p.memory_id for q in self.probation.values() for p in q]

    def release(self, memory_id: str, agent: str | None = None, newest: bool = False) -> None:
        """Take ``memory_id`` off probation (of ``agent``, else of any agent): the write
        path did not write it on the intrinsic score's account, or it was forgotten.
        ``newest``: only its latest entry (a copy of a memory sent again and dropped
        as a repeat must not release the original)."""
        if not self.probation:
            return
        for a in [agent] if agent is not None else list(self.probation):
            q = self.probation.get(a)
            if not q:
                continue
            hits = [j for j, p in enumerate(q) if p.memory_id == memory_id]
            for j in reversed(hits[-1:] if newest else hits):
                del q[j]

    def clear_probation(self) -> None:
        """Nothing on probation (a state copied for another partition: its agents' turns
        stay with the source)."""
        self.probation.clear()

    def _unbank(self, agent: str, memory_id: str) -> None:
        """Remove ``memory_id`` from ``agent``'s bank (novelty, the unrelated level and
        `IntrinsicScore.updates` no longer see it)."""
        meta = self.bank_meta.get(agent)
        if not meta:
            return
        idx = [j for j, (mid, _) in enumerate(meta) if mid == memory_id]
        for j in reversed(idx):
            for table in (self.bank, self.bank_meta, self.lex_bank):
                dq = table.get(agent)
                if dq is not None and j < len(dq):
                    del dq[j]

    def _window_stats(
        self,
        agent: str,
        vec: np.ndarray,
        lex: np.ndarray | None,
        cos: np.ndarray | None,
        fit0: float | None,
    ) -> None:
        """Feed `Contamination` the statistic the guard decides by, once it is complete.

        A turn's final fit is its best cosine to the ``window`` turns before it and the
        ``lookahead`` turns after it (the veto plus the suspects' vindication); it is
        counted when the last of those has arrived, with its null draw: the best cosine
        to a run of as many consecutive older memories of the agent (not among the
        last 2 x window), drawn at decision time. ``fit0``: the fit the guard judged the
        turn by (its previous turns and next observation); None where the guard could
        not judge it (no previous turn: it is never vetoed then).
        """
        cfg = self.config
        pend = _bounded(self.pending, agent, deque, cfg.max_agents)
        for p in pend:
            p[1] = max(p[1], self._sim(p[0], p[6], vec, lex))
            p[3] -= 1
        while pend and pend[0][3] <= 0:
            _, fit, null, _, mu, sd, _ = pend.popleft()
            self.contamination.add((fit - mu) / sd, None if null is None else (null - mu) / sd)
        unrel = self._unrelated()
        if fit0 is None or unrel is None:
            return
        mu, sd = unrel[0], max(unrel[1], 1e-6)
        m = cfg.window + cfg.lookahead
        null = None
        if cos is not None and cos.size > 2 * cfg.window + m:
            old = cos[: cos.size - 2 * cfg.window]
            # a contiguous run: a window of turns is about one topic; memories picked
            # one by one would cover several and fit better than an unrelated window
            start = int(self._rng.integers(old.size - m + 1))
            null = float(old[start : start + m].max())
        if cfg.lookahead == 0:
            self.contamination.add((fit0 - mu) / sd, None if null is None else (null - mu) / sd)
        else:
            # a copy: a row view would keep the whole batch array alive
            pend.append([np.array(vec, dtype=np.float32), fit0, null, cfg.lookahead, mu, sd, lex])

    # ------------------------------------------------------------------- API
    def score_batch(
        self,
        agents: Sequence[str],
        texts: Sequence[str | None],
        s: np.ndarray,
        s_next: np.ndarray,
        has_next: Sequence[bool],
        ids: Sequence[str] | None = None,
        episodes: Sequence[str] | None = None,
        next_texts: Sequence[str | None] | None = None,
    ) -> list[IntrinsicScore]:
        """Score a tenant's batch in stream order, then learn from it.

        Each transition is judged against the state before it, which includes the
        earlier transitions of the batch (token model, recent turns, bank, suspects),
        so a turn's score does not depend on where batch boundaries fall. ``ids``
        (the transitions' memory ids) lets a vetoed turn wait as a suspect for a
        later turn that refers to it (`IntrinsicScore.vindicates`); without them a
        veto is final. ``episodes`` (the transitions' episode ids) scope the repeat
        discount to the episode (``repeat_scope``); without them it spans the agent.
        ``next_texts`` (the next observations' texts) give the guard the next turn's
        words as well as its embedding.
        """
        cfg = self.config
        n = len(agents)
        rnd_err = None
        if any(t is None for t in texts):
            rnd_err = self.rnd.errors(s)
        out: list[IntrinsicScore] = []
        for i in range(n):
            agent, vec = agents[i], s[i]
            text = texts[i]
            episode = episodes[i] if episodes is not None else None
            tok = self.tokens.ids(text) if text is not None else None
            lex = self.lexical(text, tok)
            if text is not None:
                assert tok is not None
                total = self.tokens.summed(tok)
                if type(self.tokens).surprisal is TokenSurprisal.surprisal:
                    info = self.tokens.scaled(total, int(tok.size))
                    w = cfg.sentence_weight
                    if w > 0.0 and self.tokens.n0 is not None:  # per token only
                        info = (1.0 - w) * info + w * self.tokens.best_sentence(text, tok)
                else:  # a measured alternative term (`operators.conversation_score`)
                    info = self.tokens.surprisal(tok)
                self.tokens.learn(tok)
                disclosed = cfg.disclosure > 0.0 and discloses(text, cfg.machine_speakers)
                info = self._per_speaker(
                    agent, text, info * self._disclosed(agent, text, disclosed)
                )
            else:
                assert rnd_err is not None
                info = total = float(rnd_err[i])
                disclosed = False
            bank = self._agent_bank(agent)
            novelty = 1.0
            cos = gcos = None
            if bank is not None:
                cos = bank @ vec
                novelty = self._novelty(agent, cos, episode)
                gcos = self._bank_sim(agent, cos, lex)
                # the unrelated level: the guard's similarity to memories this turn
                # does not repeat
                far = gcos[cos < cfg.repeat_cos]
                if far.size:
                    self.unrel_mean.add(float(far.mean()))
                    self.unrel_sq.add(float((far * far).mean()))
            # fit: the best cosine to the agent's last `window` turns and the next one
            recent = _bounded(self.recent, agent, lambda: deque(maxlen=cfg.window), cfg.max_agents)
            lrec = _bounded(
                self.lex_recent, agent, lambda: deque(maxlen=cfg.window), cfg.max_agents
            )
            if len(lrec) != len(recent):  # a bounded table evicted one of the two
                lrec.clear()
                lrec.extend([None] * len(recent))
            fits = [self._sim(r, lr, vec, lex) for r, lr in zip(recent, lrec, strict=True)]
            if has_next[i]:
                nlex = self.lexical(next_texts[i]) if next_texts is not None else None
                fits.append(self._sim(s_next[i], nlex, vec, lex))
            fit = max(fits) if fits else 1.0
            unrel = self._unrelated()
            updates = None
            level = unrel if unrel is not None else self._cold_unrelated(agent)
            if text is not None and gcos is not None and level is not None:
                # in the unrelated level's own units: the guard's similarity, meaning
                # and words (the embeddings' cosine alone runs higher than that level
                # for any two turns of a chat, so unrelated turns passed as updates);
                # strictly above it, and never on a spread of 0 (states as one-hot
                # vectors: every pair at the level, none an update of another)
                j = int(np.argmax(gcos))
                if float(gcos[j]) > level[0] + cfg.update_k * max(level[1], 1e-6):
                    known = self.bank_meta.get(agent)
                    updates = known[j][0] if known is not None and j < len(known) else None
            threshold = -math.inf
            # the guard has no yardstick yet, or not the contamination's: its call on a
            # turn it lets through is provisional (``recheck_cold``)
            cold = unrel is None or not self.contamination.warm
            if unrel is not None:
                # fit_k, or the contamination-adaptive cut (`Contamination`, in the same
                # std units) where that is stricter
                k = max(cfg.fit_k, self.contamination.cut(cfg.off_posterior))
                threshold = unrel[0] + k * unrel[1]
            factor = min(1.0, max(novelty, 0.0) / (1.0 - cfg.repeat_cos))
            mean_info = self.info_mean.mean if self.info_mean.count else info
            self.info_mean.add(info)
            raw = info * factor / max(mean_info, 1e-9)
            # never without a context and a yardstick, nor for a turn that says several
            # typical turns' worth in all (a fact announced out of the blue): judged on
            # the summed information, which a long specific announcement has plenty of
            mean_total = self.total_mean.mean if self.total_mean.count else total
            self.total_mean.add(total)
            exempt = total * factor / max(mean_total, 1e-9) >= cfg.fit_exempt
            off = bool(recent) and fit < threshold and not exempt
            vind = self._vindicated(agent, vec, lex)
            self._window_stats(agent, vec, lex, gcos, fit if recent else None)
            if off and ids is not None and cfg.lookahead > 0:
                pend = _bounded(self.suspects, agent, list, cfg.max_agents)
                pend.append(
                    _Suspect(ids[i], vec.copy(), float(raw), threshold, cfg.lookahead, episode, lex)
                )
            retracts: tuple[tuple[str, str | None], ...] = ()
            probation = False
            if cfg.recheck_cold:
                retracts = self._recheck(agent, vec, lex)
                if cold and recent and not off and not exempt and ids is not None:
                    entry = _Probation(ids[i], vec.copy(), fit, cfg.lookahead, episode, lex)
                    self._on_probation(agent, entry)
                    probation = True
            score = 0.0 if off else raw
            out.append(
                IntrinsicScore(
                    float(score),
                    float(info),
                    novelty,
                    fit,
                    off,
                    float(raw),
                    tuple((v.memory_id, v.raw, v.vec) for v in vind),
                    updates,
                    disclosed,
                    retracts,
                    probation,
                )
            )
            recent.append(np.asarray(vec, dtype=np.float32).copy())
            lrec.append(lex)
            # the bank: what the agent would remember (decided here, per turn, so the
            # score never depends on batch boundaries or on the gate's routes)
            for v in vind:
                if v.raw >= cfg.bank_min:
                    self.stored(agent, v.vec, v.memory_id, v.episode, v.lex)
            if score >= cfg.bank_min:
                self.stored(agent, vec, None if ids is None else ids[i], episode, lex)
        if rnd_err is not None:
            self.rnd.learn(s)
        return out

    def _novelty(self, agent: str, cos: np.ndarray, episode: str | None) -> float:
        """1 - the best cosine to the agent's bank, or, with ``repeat_scope`` "episode"
        and a known episode, to the bank's memories of that episode (1 when it has
        none): a restatement in a later session is not a repeat of this one."""
        if self.config.repeat_scope == "episode" and episode is not None:
            meta = self.bank_meta.get(agent)
            if meta is not None and len(meta) == cos.size:
                same = np.fromiter((m[1] == episode for m in meta), dtype=bool, count=cos.size)
                return float(1.0 - cos[same].max()) if same.any() else 1.0
        return float(1.0 - cos.max())

    def _speaker(self, table: OrderedDict[str, _Running], agent: str, text: str) -> _Running:
        """The running mean in ``table`` of the speaker of ``text`` (its ``"speaker: "``
        prefix; none is the speaker "") for ``agent``."""
        key = f"{agent}\x1f{speaker_of(text)}"
        return _bounded(
            table, key, lambda: _Running(self.config.stats_alpha), self.config.max_agents
        )

    def _disclosed(self, agent: str, text: str, disclosed: bool) -> float:
        """The information factor of a turn that discloses (``1 + disclosure``) or not
        (1), over the speaker's mean factor so far: within a speaker a disclosure ranks
        above a request, and the speaker's mean information stays where it was (one who
        discloses in every turn scores as without the weight)."""
        w = self.config.disclosure
        if w <= 0.0:
            return 1.0
        r = self._speaker(self.disclosures, agent, text)
        factor = 1.0 + w * float(disclosed)
        mean = r.mean if r.count else factor
        r.add(factor)
        return factor / max(mean, 1e-9)

    def _per_speaker(self, agent: str, text: str, info: float) -> float:
        """``info`` over the running mean of its speaker's turns to the power
        ``speaker_pooling`` (the mean before this turn; a speaker's first turn is its
        own yardstick). A text without a ``"speaker: "`` prefix is the speaker ""."""
        g = self.config.speaker_pooling
        if g <= 0.0:
            return info
        r = self._speaker(self.speakers, agent, text)
        mean = r.mean if r.count else info
        r.add(info)
        return info / max(mean, 1e-9) ** g

    # ----------------------------------------------------------- checkpoints
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": _MIX_FORMAT,
            "dim": self.dim,
            "config": self.config.__dict__,
            "tokens": self.tokens.to_dict(),
            "rnd": self.rnd.to_dict(),
            "mixes": self.mix.to_dict(),
            "running": {name: [r.mean, r.count] for name, r in self._runnings().items()},
            "contamination": self.contamination.to_dict(),
            "speakers": {k: [r.mean, r.count] for k, r in self.speakers.items()},
            "disclosures": {k: [r.mean, r.count] for k, r in self.disclosures.items()},
            "suspects": {
                agent: [_waiting_to_dict(x) for x in pend]
                for agent, pend in list(self.suspects.items())[-SUSPECT_AGENTS:]
                if pend
            },
        } | self._probation_dict()

    def _probation_dict(self) -> dict[str, Any]:
        """The turns on probation, for a checkpoint (nothing without any)."""
        if not self.probation_size:
            return {}
        waiting = {agent: [_waiting_to_dict(x) for x in pq]
                   for agent, pq in self.probation.items() if pq}  # fmt: skip
        return {"probation": waiting}

    def _runnings(self) -> dict[str, _Running]:
        return {
            "info": self.info_mean,
            "total": self.total_mean,
            "unrel": self.unrel_mean,
            "unrel_sq": self.unrel_sq,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], config: IntrinsicConfig | None = None) -> IntrinsicState:
        """``config``: the operator's current knobs, which win over the checkpointed
        ones (a restart with a changed ``DMEM_INTRINSIC__*`` applies it); without it
        the checkpoint's own."""
        if d.get("format") != _MIX_FORMAT:
            raise ValueError(f"unknown intrinsic state format {d.get('format')}")
        known = IntrinsicConfig.__dataclass_fields__
        # knobs this version does not know (retired ones: ctx_alpha, off_streak_max) are ignored
        cfg = config or IntrinsicConfig(**{k: v for k, v in d["config"].items() if k in known})
        st = cls(int(d["dim"]), cfg)
        st.tokens = TokenSurprisal.from_dict(d["tokens"])
        # the information term changed (shrinkage, or the sentence mix: a checkpoint
        # without the knob had none): its running means restart on the new scale
        rescaled = st.tokens.n0 != cfg.info_n0 or float(
            d["config"].get("sentence_weight", 0.0)
        ) != float(cfg.sentence_weight)
        st.tokens.n0 = cfg.info_n0
        st.rnd = RndSurprise.from_dict(d["rnd"])
        # a checkpoint with one tenant-wide mix ("mix") gives no agent's rate: every
        # agent relearns its own from its next batch on
        if "mixes" in d:
            st.mix = AgentRewardMix.from_dict(d["mixes"])
            st.mix.max_agents = cfg.max_agents
        st.mix.set_rate_full(cfg.reward_rate_full)
        for name, r in st._runnings().items():
            if name in d["running"]:
                r.mean, r.count = float(d["running"][name][0]), int(d["running"][name][1])
        if "total" not in d["running"]:  # a checkpoint whose information term is the sum
            st.total_mean.mean, st.total_mean.count = st.info_mean.mean, st.info_mean.count
        if rescaled:  # the mean information is on the other term's scale
            st.info_mean = _Running(cfg.stats_alpha)
        if "contamination" in d:  # absent from older checkpoints
            st.contamination.load(d["contamination"])
        if not rescaled:  # per-speaker means are on the information term's scale
            for key, (mean, count) in list(d.get("speakers", {}).items())[-cfg.max_agents :]:
                r = st.speakers[str(key)] = _Running(cfg.stats_alpha)
                r.mean, r.count = float(mean), int(count)
        for key, (mean, count) in list(d.get("disclosures", {}).items())[-cfg.max_agents :]:
            if str(key).rpartition("\x1f")[2] in cfg.machine_speakers:
                continue  # never discloses: a rate it kept from before is stale
            r = st.disclosures[str(key)] = _Running(cfg.stats_alpha)
            r.mean, r.count = float(mean), int(count)
        if "speakers" not in d and cfg.speaker_pooling > 0.0:  # the unpooled term's mean
            st.info_mean = _Running(cfg.stats_alpha)
        # turns vetoed as off-context still waiting for a reply that refers to them: a
        # restart between a turn and its reply must not lose the vindication
        for agent, pend in d.get("suspects", {}).items():
            if len(pend) and len(st.suspects) < cfg.max_agents:
                st.suspects[str(agent)] = [_waiting_from_dict(_Suspect, x) for x in pend]
        # turns the cold guard let through, still to be judged by the warm one
        for agent, pq in d.get("probation", {}).items() if cfg.recheck_cold else ():
            if len(pq) and len(st.probation) < cfg.max_agents:
                st.probation[str(agent)] = deque(_waiting_from_dict(_Probation, x) for x in pq)
        return st
