"""The base of every API model: camelCase on the wire, strict types, object-level rules."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel

from pdmtp.api import rules as r
from pdmtp.api.rules import Rule


def defaulted(model: type[BaseModel]) -> dict[str, Any]:
    """A schema default for an omitted nested object: the model's own defaults, spelled out.

    `default: {}` is not enough: the API server checks defaults against the CEL rules as they
    stand, before nested defaults are filled in.
    """
    return {"default": model().model_dump(by_alias=True, exclude_none=True, mode="json")}


class Model(BaseModel):
    """Base: camelCase on the wire, unknown fields rejected, no type coercion (the API server
    refuses "3" for an integer, so the model does too), defaults validated. `RULES` are the
    object-level rules, checked here and rendered as CEL (`model_rules`)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
        frozen=True,
        strict=True,
    )
    RULES: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Any:
        r.check_model(self, type(self).RULES)
        return self
