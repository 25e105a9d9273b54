"""Ids the SDK derives from a caller's ids (an episode from a conversation, a LangGraph
namespace's agent scope) must be valid `Ident`s whatever the caller's ids' length."""

from __future__ import annotations

from schemas import LIMITS
from schemas.models import _fitted_id


def fit_id(prefix: str, name: str, suffix: str = "") -> str:
    """``prefix + name + suffix`` where that fits an id (`LIMITS.max_id_chars`), else
    with ``name`` replaced by its hash (as `schemas.models.final_outcome_id` does), else
    (a long prefix or suffix) the hash of the whole. The same input gives the same id,
    and the readable form is kept whenever it fits, so short ids never change."""
    out = _fitted_id(prefix, name, suffix)
    if len(out) <= LIMITS.max_id_chars:
        return out
    return _fitted_id("", f"{prefix}{name}{suffix}", "")


__all__ = ["fit_id"]
