"""The one error tree. Every class says whether retrying can help.

    DmemError (retriable=False)
    ├── ConfigError            bad settings; fix the config (not retriable)
    ├── InvalidRecord          a payload failed validation; dead-letter it (not retriable)
    ├── ServiceUnavailable     broker or Milvus unreachable / timed out (retriable)
    │   ├── BrokerUnavailable
    │   └── StoreUnavailable
    └── StoreError             Milvus refused an operation for a non-transient reason

Errors carry the record's coordinates (topic/partition/offset/key) when known,
so a log line or a dead letter points at the exact input.
"""

from __future__ import annotations


class DmemError(Exception):
    retriable: bool = False

    def __init__(
        self,
        message: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key

    def __str__(self) -> str:
        where = [
            f"{k}={v}"
            for k, v in (
                ("topic", self.topic),
                ("partition", self.partition),
                ("offset", self.offset),
                ("key", self.key),
            )
            if v is not None
        ]
        return self.message + (f" ({', '.join(where)})" if where else "")


class ConfigError(DmemError):
    retriable = False


class InvalidRecord(DmemError):
    retriable = False


class ServiceUnavailable(DmemError):
    retriable = True


class BrokerUnavailable(ServiceUnavailable):
    pass


class StoreUnavailable(ServiceUnavailable):
    pass


class StoreError(DmemError):
    retriable = False
