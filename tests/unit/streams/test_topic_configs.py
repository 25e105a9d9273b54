"""The configs dmem creates its topics with: the checkpoint topic is compacted and
takes the write producer's largest request, which a broker's default (1 MB on Apache
Kafka) refuses; the others keep the broker's defaults."""

from __future__ import annotations

from schemas.topics import TOPICS
from streams.admin import topic_configs


def test_the_checkpoint_topic_takes_the_producers_largest_request() -> None:
    models = topic_configs(TOPICS["models"])
    assert models["cleanup.policy"] == "compact"
    assert int(models["max.message.bytes"]) > 8 * 1024 * 1024  # the write producer's cap
    assert topic_configs(TOPICS["transitions"]) == {}
