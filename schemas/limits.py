"""Validation limits shared by every model (and reported in the JSON Schemas).

Why limits at all: one agent with a runaway prompt must not be able to push a
megabyte of text into every memory row or a 100k-dim "state" into Milvus.
Records beyond these limits are dead-lettered with a reason, never truncated
silently.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_text_chars: int = 8_192
    max_id_chars: int = 128
    max_vector_dim: int = 4_096
    max_metadata_keys: int = 32
    max_metadata_value_chars: int = 512
    max_k: int = 100
    max_message_bytes: int = 1_048_576
    #: a transition's ``metadata`` and ``next_observation`` as UTF-8 JSON: they travel
    #: in the memory row's JSON field, which Milvus caps at 64 KiB; the rest of that
    #: budget is dmem's own (gate, surprise, credit, merges). The character limits
    #: above allow four times as many bytes in scripts of 4-byte characters (emoji).
    max_row_json_bytes: int = 40_960


LIMITS = Limits()
