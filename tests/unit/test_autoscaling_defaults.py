"""spec.autoscaling's defaults are written once, in `AUTOSCALING_DEFAULTS`: the pydantic models,
the CRD (its `default` and its "Default: ..." descriptions) and the README's table must all say
what that table says. Change a default anywhere else and this fails."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from pdmtp.api.autoscaling import (
    AUTOSCALING_DEFAULTS,
    AutoscalingSpec,
    Behavior,
    Default,
    RatioBand,
    RoleAutoscaling,
    ScalingRules,
    SignalTarget,
    defaults_markdown,
)
from pdmtp.api.crd import openapi_schema
from pydantic import BaseModel

PLACEHOLDERS = {"<role>": ("prefill", "decode"), "<direction>": ("scaleUp", "scaleDown")}
MODELS: tuple[type[BaseModel], ...] = (
    AutoscalingSpec,
    RoleAutoscaling,
    Behavior,
    ScalingRules,
    SignalTarget,
    RatioBand,
)


def concrete_paths(row: Default[Any]) -> Iterator[list[str]]:
    """The row's field path with every placeholder filled in every way."""
    options = [PLACEHOLDERS.get(part, (part,)) for part in row.field.split(".")]
    for path in itertools.product(*options):
        yield list(path)


def crd_node(path: list[str]) -> dict[str, Any]:
    node: dict[str, Any] = openapi_schema()["properties"]["spec"]["properties"]["autoscaling"]
    for part in path:
        node = node["properties"][part]
    return node


def model_dump_at(path: list[str]) -> Any:
    """What the model holds at `path` when nothing optional is written; below behavior's
    directions, with each direction given its one required field (so ScalingRules' own
    defaults show)."""
    bare = RoleAutoscaling(min_replicas=1, max_replicas=2)
    window_only = ScalingRules(stabilization_window_seconds=0)
    directions = bare.model_copy(
        update={"behavior": Behavior(scale_up=window_only, scale_down=window_only)}
    )
    role = directions if len(path) > 3 else bare
    value: Any = AutoscalingSpec(prefill=role, decode=role).model_dump(by_alias=True, mode="json")
    for part in path:
        value = None if value is None else value[part]  # an omitted object holds nothing
    return value


@pytest.mark.parametrize("row", AUTOSCALING_DEFAULTS, ids=lambda row: f"{row.field} {row.case}")
def test_the_model_and_the_crd_say_what_the_table_says(row: Default[Any]) -> None:
    for path in concrete_paths(row):
        where = "spec.autoscaling." + ".".join(path)
        node = crd_node(path)
        assert row.sentence in node["description"], where
        held = model_dump_at(path)
        if held is not None:  # a pydantic default: the API server applies the same one
            assert held == row.wire, f"{where}: the model's default {held!r}, the table's"
            assert node.get("default") == row.wire, f"{where}: the CRD's default"
        else:  # omitted means "the table's": the API server must not fill in another
            assert "default" not in node, where


def test_every_default_in_the_models_is_in_the_table() -> None:
    """A default written straight into a Field, past the table, fails here."""
    listed = {row.field.rsplit(".", 1)[-1] for row in AUTOSCALING_DEFAULTS}
    for model in MODELS:
        for name, info in model.model_fields.items():
            if info.is_required() or info.default is None:
                continue
            assert info.alias in listed or name in listed, f"{model.__name__}.{name}"


def test_the_readme_table_has_a_row_per_default_with_its_value() -> None:
    lines = defaults_markdown().splitlines()
    rows = lines[2:]
    assert len(rows) == len(AUTOSCALING_DEFAULTS)
    for line, row in zip(rows, AUTOSCALING_DEFAULTS, strict=True):
        assert f"`{row.field}`" in line and f"`{row.shown}`" in line and row.meaning in line
