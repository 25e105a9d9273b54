"""The vectorised partitioner must pick exactly aiokafka's default partition."""

import random

from aiokafka.partitioner import DefaultPartitioner, murmur2

from streams.partitioner import murmur2_many, partitions_for_keys


def test_murmur2_matches_aiokafka_for_every_length_and_byte() -> None:
    rng = random.Random(3)
    keys = [bytes(rng.randrange(256) for _ in range(n % 41)) for n in range(2000)]
    keys += [b"", b"a", b"ab", b"abc", b"\xff" * 7]
    assert murmur2_many(keys).tolist() == [murmur2(k) for k in keys]


def test_partitions_match_default_partitioner() -> None:
    rng = random.Random(4)
    keys = [f"{rng.getrandbits(128):032x}".encode() for _ in range(500)]
    keys += [f"user-{i}".encode() for i in range(100)]
    for parts in ([0], [0, 1, 2, 3], list(range(7)), [3, 1, 2, 0]):
        want = [DefaultPartitioner()(k, sorted(parts), parts) for k in keys]
        assert partitions_for_keys(keys, parts) == want
    assert partitions_for_keys([], [0, 1]) == []


def test_records_keyed_and_keyless_take_one_path() -> None:
    from streams.partitioner import partitions_for_keys, partitions_for_records

    keys = [b"a", None, b"b", None, None, b"a"]
    got = partitions_for_records(keys, [2, 0, 1])
    keyed = partitions_for_keys([b"a", b"b", b"a"], [0, 1, 2])
    assert [got[0], got[2], got[5]] == keyed
    assert [got[1], got[3], got[4]] == [0, 1, 2]  # keyless: round-robin, in order
