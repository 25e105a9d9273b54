"""Kafka's default key partitioner (murmur2), vectorised over a batch of keys.

Why: the write path produces one MemoryEvent per transition, keyed by memory id,
and aiokafka's pure-Python murmur2 is a noticeable share of the write worker's
CPU. Computing the partitions of a whole batch with
numpy gives exactly the partition aiokafka (and the Java client) would choose,
``(murmur2(key) & 0x7fffffff) % n``, so per-key ordering with events produced
elsewhere through the default partitioner (maintenance, credit) is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_M = np.uint64(0x5BD1E995)
_MASK = np.uint64(0xFFFFFFFF)
_SEED = 0x9747B28C


def murmur2_many(keys: Sequence[bytes]) -> np.ndarray:
    """murmur2 of each key (uint64 array of 32-bit values), as `aiokafka.partitioner.murmur2`."""
    out = np.empty(len(keys), dtype=np.uint64)
    by_len: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        by_len.setdefault(len(k), []).append(i)
    for length, idx in by_len.items():
        data = np.frombuffer(b"".join(keys[i] for i in idx), dtype=np.uint8)
        data = data.reshape(len(idx), length).astype(np.uint64)
        h = np.full(len(idx), (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint64)
        n4 = length // 4
        for j in range(n4):
            b = data[:, 4 * j : 4 * j + 4]
            k = b[:, 0] | (b[:, 1] << np.uint64(8)) | (b[:, 2] << np.uint64(16))
            k |= b[:, 3] << np.uint64(24)
            k = (k * _M) & _MASK
            k ^= k >> np.uint64(24)
            k = (k * _M) & _MASK
            h = (h * _M) & _MASK
            h ^= k
        tail = 4 * n4
        extra = length % 4
        if extra >= 3:
            h ^= data[:, tail + 2] << np.uint64(16)
        if extra >= 2:
            h ^= data[:, tail + 1] << np.uint64(8)
        if extra >= 1:
            h ^= data[:, tail]
            h = (h * _M) & _MASK
        h ^= h >> np.uint64(13)
        h = (h * _M) & _MASK
        h ^= h >> np.uint64(15)
        out[idx] = h
    return out


def partitions_for_keys(keys: Sequence[bytes], partitions: Sequence[int]) -> list[int]:
    """The default partitioner's choice for each key, given the topic's sorted partitions."""
    if not keys:
        return []
    parts = sorted(partitions)
    idx = (murmur2_many(keys) & np.uint64(0x7FFFFFFF)) % np.uint64(len(parts))
    return [parts[i] for i in idx.tolist()]


def partitions_for_records(keys: Sequence[bytes | None], partitions: Sequence[int]) -> list[int]:
    """One partition per record, keyed or not: the single path every produced record takes.

    Keyed records go where the default partitioner sends them (murmur2, so a key's
    records stay on one partition and in order); keyless ones (a dead letter of a
    record that had no key) are spread round-robin in arrival order.
    """
    parts = sorted(partitions)
    keyed = [k for k in keys if k is not None]
    hashed = iter(partitions_for_keys(keyed, parts))
    out: list[int] = []
    spread = 0
    for k in keys:
        if k is not None:
            out.append(next(hashed))
        else:
            out.append(parts[spread % len(parts)])
            spread += 1
    return out


__all__ = ["murmur2_many", "partitions_for_keys", "partitions_for_records"]
