"""One verdict on a PDDeployment object, worded once: what `pdmtp validate` prints, what the
admission webhook refuses with, and what the ConfigCompatible condition says.

A verdict has problems of two kinds: the object does not parse as a PDDeployment (types, bounds,
unknown fields: reason InvalidSpec), or it parses and breaks a cross-role rule (the agreement's
findings). Each problem reads `<reason>: <message>` wherever a line is wanted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from pdmtp.api import reasons
from pdmtp.api.corev1 import SCHEMA_ERROR
from pdmtp.api.rules import RULE_ERROR
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.core.agreement import Agreement, check


@dataclass(frozen=True)
class Problem:
    reason: str
    message: str

    def line(self) -> str:
        return f"{self.reason}: {self.message}"


@dataclass(frozen=True)
class Validation:
    """`pdd` and `agreement` are None when the object does not parse."""

    pdd: PDDeployment | None
    agreement: Agreement | None
    problems: tuple[Problem, ...]

    @property
    def usable(self) -> bool:
        return self.pdd is not None

    @property
    def compatible(self) -> bool:
        return self.usable and not self.problems

    def message(self) -> str:
        """All problems' messages in one line (a condition's message)."""
        return "; ".join(p.message for p in self.problems)


def field_path(loc: Sequence[int | str]) -> str:
    """pydantic's error location as a field path: `spec.prefill.env[0].name`."""
    path = ""
    for part in loc:
        if isinstance(part, str) and part.startswith("function-"):
            continue  # a validator's own frame, not a field
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(document)"


def field_problems(error: ValidationError) -> list[str]:
    """One line per broken field: `field.path: what is wrong (got <value>)`."""
    lines = []
    for e in error.errors():
        where = field_path(e["loc"])
        if e["type"] == SCHEMA_ERROR:
            # Kubernetes' schema of a core/v1 field: one line per problem, in its words.
            lines += [f"{where}{rel}: {what}" for rel, what in (e.get("ctx") or {})["problems"]]
        elif e["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown field")
        elif e["type"] == "missing":
            lines.append(f"{where}: {e['msg']}")
        elif e["type"] == RULE_ERROR and isinstance(e.get("input"), dict):
            lines.append(f"{where}: {e['msg']}")  # an object's rule: the object says nothing
        else:
            lines.append(f"{where}: {e['msg']} (got {e.get('input')!r})")
    return lines


def validate(body: Mapping[str, Any]) -> Validation:
    """Parse `body` (status ignored) and check every cross-role rule."""
    try:
        pdd = PDDeployment.model_validate({**body, "status": None})
    except ValidationError as e:
        return Validation(
            None, None, (Problem(reasons.INVALID_SPEC, "; ".join(field_problems(e))),)
        )
    agreement = check(pdd.spec)
    return Validation(
        pdd, agreement, tuple(Problem(f.reason, f.message) for f in agreement.findings)
    )
