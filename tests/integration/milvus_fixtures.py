"""Milvus fixtures for integration tests.

- ``milvus_server_uri``: one Milvus server per test session, stopped at the end:
  the embedded 2.3.5 server wheel (free ports, temp data dir; skips with the install
  command when the wheel is not installed) or, with ``DMEM_TEST_BACKEND=containers``,
  Milvus standalone from docker-compose.yml's image via testcontainers (skips with
  the reason where no Docker engine answers). ``DMEM_TEST_MILVUS_URI`` points the
  tests at an existing server instead.
- ``milvus_uri``: parametrised over ``lite`` (a fresh ``.db`` file per test) and
  ``server``; use it with ``store_factory`` for backend-agnostic tests.
- ``store_factory``: builds connected ``MemoryStore``s; every store is closed after
  the test. On a server, creating + loading a collection costs ~4 s, so collections
  come from a session pool: after each test they are emptied (delete all rows) and
  reused by the next test asking for the same dim; the pool is dropped at the end.
  Lite tests get a fresh ``.db`` file each.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dmem_bench.backends import BackendChoice, milvus_service
from milvus import MemoryStore, milvus_lite_uri
from schemas.errors import ConfigError

__all__ = [
    "make_record",
    "milvus_collection_pool",
    "milvus_server_uri",
    "milvus_uri",
    "store_factory",
    "unit_vector",
]


@pytest.fixture(scope="session")
def milvus_server_uri(
    test_backend: BackendChoice, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    external = os.environ.get("DMEM_TEST_MILVUS_URI")
    if external:
        yield external
        return
    if test_backend.skip_reason:
        pytest.skip(test_backend.skip_reason)
    data = tmp_path_factory.mktemp("milvus-server")
    with contextlib.ExitStack() as stack:
        try:
            uri = stack.enter_context(
                milvus_service(test_backend, data, stop_grace_s=3, time_tick_ms=20)
            )
        except ConfigError as exc:  # the server wheel is not installed
            pytest.skip(str(exc))
        yield uri


@pytest.fixture(params=["lite", "server"])
def milvus_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "lite":
        return milvus_lite_uri(tmp_path / "lite", name="m")
    return str(request.getfixturevalue("milvus_server_uri"))


class _CollectionPool:
    """Server collections kept across tests: name -> dim, and the free ones."""

    def __init__(self) -> None:
        self.free: dict[tuple[str, int], list[str]] = {}
        self.all: set[tuple[str, str]] = set()

    def take(self, uri: str, dim: int) -> str:
        names = self.free.get((uri, dim))
        if names:
            return names.pop()
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.all.add((uri, name))
        return name

    def give_back(self, uri: str, dim: int, name: str) -> None:
        try:
            store = MemoryStore(uri, collection=name, dim=dim).connect()
            try:
                store.client.delete(name, filter='id != ""', timeout=10)
                if store.client.has_collection(store.history.name, timeout=10):
                    store.client.delete(store.history.name, filter='key != ""', timeout=10)
                store.tombstones.clear()  # the next test's ids are not this one's forgets
                if store.count() != 0:
                    raise RuntimeError("collection not empty")
            finally:
                store.close()
        except Exception:  # dropped, or unusable: let the next test make a new one
            self.drop(uri, name)
            return
        self.free.setdefault((uri, dim), []).append(name)

    def drop(self, uri: str, name: str) -> None:
        try:
            MemoryStore(uri, collection=name).drop()
        except Exception:
            pass


@pytest.fixture(scope="session")
def milvus_collection_pool() -> Iterator[_CollectionPool]:
    pool = _CollectionPool()
    yield pool
    for uri, name in pool.all:
        pool.drop(uri, name)


@pytest.fixture
def store_factory(
    milvus_uri: str, milvus_collection_pool: _CollectionPool
) -> Iterator[Callable[..., MemoryStore]]:
    """``store_factory(dim=8, collection=None, uri=None, connect=True, **MemoryStore kw)``.

    Without ``collection`` each call gets its own empty collection.
    """
    pool = milvus_collection_pool
    made: list[MemoryStore] = []
    pooled: list[tuple[str, int, str]] = []
    lite_names: set[tuple[str, str]] = set()

    def factory(
        dim: int = 8,
        collection: str | None = None,
        uri: str | None = None,
        connect: bool = True,
        **kw: Any,
    ) -> MemoryStore:
        target = uri or milvus_uri
        lite = MemoryStore(target).is_lite
        if collection is None:
            if lite:
                collection = f"t_{uuid.uuid4().hex[:12]}"
                lite_names.add((target, collection))
            else:
                collection = pool.take(target, dim)
                pooled.append((target, dim, collection))
        store = MemoryStore(target, collection=collection, dim=dim, **kw)
        made.append(store)
        if connect:
            store.connect()
        return store

    yield factory
    for store in made:
        store.close()
    for target, dim, name in pooled:
        pool.give_back(target, dim, name)
    for target, name in lite_names:
        pool.drop(target, name)


def unit_vector(dim: int, seed: int | None = None, *, base: np.ndarray | None = None,
                noise: float = 0.0) -> np.ndarray:  # fmt: skip
    """A random unit vector, or ``base`` plus noise, normalised."""
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(dim).astype(np.float32) if base is None else base.copy()
    if noise:
        v = v + noise * rng.standard_normal(dim).astype(np.float32)
    return (v / np.linalg.norm(v)).astype(np.float32)


def make_record(
    rid: str,
    *,
    dim: int = 8,
    tenant: str = "acme",
    agent_id: str = "agent-1",
    vector: np.ndarray | None = None,
    seed: int | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A complete MemoryRecord-shaped dict."""
    rec: dict[str, Any] = {
        "id": rid,
        "tenant": tenant,
        "agent_id": agent_id,
        "episode_id": "ep-1",
        "step": 0,
        "vector": vector if vector is not None else unit_vector(dim, seed),
        "text": f"memory {rid}",
        "action": "noop",
        "reward": 0.5,
        "rpe": 0.1,
        "rpe_smoothed": 0.1,
        "gate": 0.7,
        "valence": 1,
        "created_ts": 1_700_000_000_000,
        "last_access_ts": 1_700_000_000_000,
        "metadata": {"task": "demo"},
    }
    rec.update(fields)
    return rec
