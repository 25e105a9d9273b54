"""Encoders: unit norm, determinism, similarity ordering, cache, factory errors."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from operators.encoders import (
    CachedEncoder,
    Encoder,
    HashingEncoder,
    MiniLMEncoder,
    PassthroughEncoder,
    build_encoder,
)
from schemas.errors import ConfigError

SIMILAR = (
    "the agent opens the red door with the key",
    "the agent opened the red door using a key",
)
DISSIMILAR = "quarterly stock prices fell sharply on monday"


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b)


class CountingEncoder:
    """Inner encoder that records the batches it was asked to encode."""

    def __init__(self, dim: int = 16) -> None:
        self.inner = HashingEncoder(dim=dim)
        self.name = "counting"
        self.dim = dim
        self.calls: list[list[str]] = []

    def encode(self, texts):  # type: ignore[no-untyped-def]
        self.calls.append(list(texts))
        return self.inner.encode(texts)


@pytest.mark.parametrize("dim", [8, 64, 256])
def test_hashing_unit_norm_dims_dtype(dim: int) -> None:
    enc = HashingEncoder(dim=dim)
    x = enc.encode([*SIMILAR, DISSIMILAR, "", "   ", "ünïcödé 漢字"])
    assert x.shape == (6, dim)
    assert x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    assert enc.encode([]).shape == (0, dim)


def test_hashing_similar_beats_dissimilar() -> None:
    x = HashingEncoder(dim=256).encode([*SIMILAR, DISSIMILAR])
    assert _cos(x[0], x[1]) > 0.4
    assert _cos(x[0], x[1]) > _cos(x[0], x[2]) + 0.3


def test_hashing_deterministic_batch_independent_and_seeded() -> None:
    a = HashingEncoder(dim=64, seed=3)
    b = HashingEncoder(dim=64, seed=3)
    texts = [*SIMILAR, DISSIMILAR]
    np.testing.assert_array_equal(a.encode(texts), b.encode(texts))
    # a row does not depend on the other rows of its batch
    np.testing.assert_array_equal(a.encode(texts)[1], a.encode([texts[1]])[0])
    assert not np.allclose(a.encode(texts), HashingEncoder(dim=64, seed=4).encode(texts))


def test_hashing_independent_of_pythonhashseed() -> None:
    code = (
        "from operators.encoders import HashingEncoder;"
        "print(HashingEncoder(32).encode(['hello world foo']).round(6).tolist())"
    )
    # This process runs with a random hash seed; the child with a fixed one.
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    res = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        ),
    )
    here = HashingEncoder(32).encode(["hello world foo"]).round(6).tolist()
    assert res.stdout.strip() == str(here)


def test_hashing_rejects_bad_input() -> None:
    enc = HashingEncoder(16)
    with pytest.raises(TypeError):
        enc.encode("a single string")
    with pytest.raises(TypeError):
        enc.encode(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        HashingEncoder(0)


def test_passthrough_normalises_and_refuses_text() -> None:
    enc = PassthroughEncoder(3)
    x = enc.encode_vectors([[3.0, 0.0, 4.0], [0.0, -2.0, 0.0]])
    np.testing.assert_allclose(x, [[0.6, 0.0, 0.8], [0.0, -1.0, 0.0]], atol=1e-7)
    assert x.dtype == np.float32
    assert enc.encode_vectors([]).shape == (0, 3)
    with pytest.raises(TypeError):
        enc.encode(["text"])
    with pytest.raises(ValueError, match="shape"):
        enc.encode_vectors([[1.0, 2.0]])
    with pytest.raises(ValueError, match="zero-norm"):
        enc.encode_vectors([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="non-finite"):
        enc.encode_vectors([[np.nan, 0.0, 1.0]])


def test_cache_hits_misses_and_single_batched_call() -> None:
    inner = CountingEncoder(dim=16)
    enc = CachedEncoder(inner, maxsize=3)
    assert (enc.name, enc.dim) == ("counting", 16)
    first = enc.encode(["a", "b", "a"])
    assert inner.calls == [["a", "b"]]
    assert (enc.hits, enc.misses) == (1, 2)
    np.testing.assert_array_equal(first[0], first[2])
    second = enc.encode(["b", "c", "a"])
    assert inner.calls[-1] == ["c"]
    assert (enc.hits, enc.misses) == (3, 3)
    np.testing.assert_array_equal(second, inner.inner.encode(["b", "c", "a"]))
    # LRU: capacity 3, "d" evicts the least recently used ("b")
    enc.encode(["d"])
    enc.encode(["b"])
    assert inner.calls[-1] == ["b"]
    assert enc.encode([]).shape == (0, 16)


def test_cache_returns_copies() -> None:
    enc = CachedEncoder(HashingEncoder(8))
    x = enc.encode(["x"])
    x[:] = 0
    assert np.linalg.norm(enc.encode(["x"])[0]) == pytest.approx(1.0, abs=1e-6)


def test_build_encoder() -> None:
    enc = build_encoder("hash", dim=32)
    assert isinstance(enc, CachedEncoder) and enc.dim == 32
    assert isinstance(enc, Encoder)
    assert isinstance(build_encoder("hash", dim=32, cache_size=0), HashingEncoder)
    pt = build_encoder("passthrough", dim=5)
    assert isinstance(pt, PassthroughEncoder) and pt.dim == 5
    mini = build_encoder("minilm")
    assert mini.dim == 384 and isinstance(mini, CachedEncoder)
    assert isinstance(mini.inner, MiniLMEncoder) and not mini.inner.loaded
    with pytest.raises(ValueError, match="unknown encoder 'word2vec'"):
        build_encoder("word2vec")


@pytest.fixture(scope="module")
def minilm() -> MiniLMEncoder:
    enc = MiniLMEncoder()
    enc.load()
    return enc


def test_minilm_offline_unit_norm_and_similarity(minilm: MiniLMEncoder) -> None:
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    assert os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    x = minilm.encode([*SIMILAR, DISSIMILAR])
    assert x.shape == (3, 384) and x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    assert _cos(x[0], x[1]) > _cos(x[0], x[2]) + 0.3
    np.testing.assert_allclose(minilm.encode([SIMILAR[0]])[0], x[0], atol=1e-5)
    assert minilm.encode([]).shape == (0, 384)


def test_minilm_cuda_without_a_device_fails_loudly() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device exists here: test_minilm_on_cuda covers it")
    enc = build_encoder("minilm", device="cuda", cache_size=0)
    assert isinstance(enc, MiniLMEncoder) and enc.device == "cuda"
    with pytest.raises(ConfigError, match="no CUDA device"):
        enc.load()


def test_minilm_on_cuda_matches_cpu(minilm: MiniLMEncoder) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine (DMEM_ENCODER__DEVICE=cuda needs one)")
    gpu = MiniLMEncoder(device="cuda")
    x = gpu.encode([*SIMILAR, DISSIMILAR])
    assert x.shape == (3, 384) and x.dtype == np.float32
    np.testing.assert_allclose(x, minilm.encode([*SIMILAR, DISSIMILAR]), atol=1e-3)


def test_minilm_missing_path_fails_without_download() -> None:
    with pytest.raises(FileNotFoundError):
        MiniLMEncoder(model_path="/nonexistent/minilm").load()


def test_static_encoder_distilled_from_minilm_is_unit_norm_deterministic_and_semantic() -> None:
    from operators.encoders import StaticEncoder

    enc = StaticEncoder()  # distilled by scripts/setup.sh (or here, on first use)
    texts = [
        "the cat sat on the mat",
        "a cat was sitting on the mat",
        "stock prices fell sharply today",
    ]
    e = enc.encode(texts)
    assert e.shape == (3, 384) and e.dtype == np.float32
    assert np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(e, enc.encode(texts))
    assert float(e[0] @ e[1]) > float(e[0] @ e[2]) + 0.2
    assert enc.encode([]).shape == (0, 384)


def test_encoder_dim_and_build_by_name() -> None:
    from operators.encoders import CachedEncoder, build_encoder, encoder_dim

    assert encoder_dim("minilm") == 384 and encoder_dim("minilm-static") == 384
    assert encoder_dim("hash", 64) == 64
    enc = build_encoder("minilm-static", cache_size=10)
    assert isinstance(enc, CachedEncoder) and enc.dim == 384
    with pytest.raises(ValueError, match="minilm-static"):
        build_encoder("nope")
