"""The settings reference is generated from the fields' descriptions: every field has one."""

from __future__ import annotations

from pydantic import BaseModel

from streams.settings import Settings


def _leaves(model: type[BaseModel], path: str = "") -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name, field in model.model_fields.items():
        ann = field.annotation
        dotted = f"{path}.{name}" if path else name
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= _leaves(ann, dotted)
        else:
            out[dotted] = field.description
    return out


def test_every_setting_has_a_description() -> None:
    leaves = _leaves(Settings)
    assert len(leaves) >= 100
    assert sorted(k for k, d in leaves.items() if not (d and d.strip())) == []


def test_the_exact_repeat_setting_lives_in_the_gate() -> None:
    leaves = _leaves(Settings)
    assert "gate.drop_exact_repeats" in leaves and "rpe.novelty" not in leaves
