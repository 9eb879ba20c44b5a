"""Validation rules written once, enforced twice: as CEL in the CRD (the API server at admission)
and as a pydantic check (`pdmtp validate`, the webhook, the operator), with the same message.

A `Rule` carries a CEL expression over `self`, the message both layers print, and the Python
predicate. `Checked(rule, ...)` attaches rules to a field or to list items / map values
(`Annotated[str, Checked(IMAGE)]`); `model_rules(...)` attaches rules to a whole object. A rule
whose Python side is one of the agreement's findings (`pdmtp.core.agreement`) names that reason
instead of a predicate, so `pdmtp validate` reports it with its reason (exit 1) rather than as an
unusable spec.

The regular expressions are RE2-compatible (CEL `matches`) and mean the same in Python: Python
checks them with `fullmatch`, since its `$` also matches before a final newline (RE2's does not),
so `demo\n` would pass `^[a-z]+$` with `re.match` and fail CEL.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

CEL_KEY: Final = "x-kubernetes-validations"
RULE_ERROR: Final = "pdmtp_rule"
"""pydantic error type of a broken rule: its message is the rule's message, nothing added."""


@dataclass(frozen=True)
class Rule:
    cel: str
    message: str
    holds: Callable[[Any], bool] | None = None
    """The Python check; None when an agreement finding (`finding`) checks it instead."""
    finding: str | None = None
    """The agreement reason that checks this rule in Python (the operator's own check)."""

    def cel_entry(self, subject: str = "self") -> dict[str, str]:
        """The CEL rule as the CRD carries it; `subject` moves it up the schema (a rule on
        metadata.name must sit at the root: CEL cannot be attached inside metadata)."""
        rule = self.cel if subject == "self" else re.sub(r"\bself\b", subject, self.cel)
        return {"rule": rule, "message": self.message}

    def check(self, value: Any) -> None:
        if self.holds is not None and not self.holds(value):
            raise PydanticCustomError(RULE_ERROR, self.message)


class Checked:
    """Annotated metadata: the value must satisfy every rule (CEL in the schema, Python here)."""

    def __init__(self, *rules: Rule) -> None:
        self.rules = rules

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        def validate(value: Any) -> Any:
            for rule in self.rules:
                rule.check(value)
            return value

        return core_schema.no_info_after_validator_function(validate, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema.setdefault(CEL_KEY, []).extend(r.cel_entry() for r in self.rules)
        return json_schema


def model_rules(*rules: Rule) -> dict[str, Any]:
    """A model's json_schema_extra carrying object-level rules (check them in a validator)."""
    return {CEL_KEY: [r.cel_entry() for r in rules]}


def check_model(value: Any, rules: tuple[Rule, ...]) -> None:
    for rule in rules:
        rule.check(value)


# ---- grammars -------------------------------------------------------------------------------

DNS_LABEL: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_1035_LABEL: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_DNS_PART = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
QUALIFIED_NAME: Final = (
    rf"^({_DNS_PART}(\.{_DNS_PART})*/)?([A-Za-z0-9][-A-Za-z0-9_.]{{0,61}})?[A-Za-z0-9]$"
)
"""A label or annotation key: an optional DNS-subdomain prefix and a name of up to 63 chars."""
LABEL_VALUE: Final = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"

_HOST_PART = r"([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE: Final = (
    rf"^({_HOST_PART}(\.{_HOST_PART})*(:[0-9]+)?/)?{_PATH_PART}(/{_PATH_PART})*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
"""An OCI image reference: [registry[:port]/]path[:tag][@digest], path lower case."""

QUANTITY: Final = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$"
"""Kubernetes' resource.Quantity grammar (what CEL's isQuantity accepts)."""

_SUFFIX: dict[str, int | Decimal] = {
    "": 1,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def matches(pattern: str) -> Callable[[Any], bool]:
    compiled = re.compile(pattern)
    return lambda value: isinstance(value, str) and compiled.fullmatch(value) is not None


def quantity(value: int | str) -> Decimal:
    """The numeric value of a Kubernetes quantity (int, or a string in the grammar above)."""
    if isinstance(value, int):
        return Decimal(value)
    if not re.fullmatch(QUANTITY, value):
        raise ValueError(f"not a quantity: {value!r}")
    number = re.match(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)", value)
    assert number is not None
    digits, suffix = number.group(0), value[number.end() :]
    try:
        if suffix in _SUFFIX:  # before the exponent: 8E (exa) and 8Ei (exbi) are suffixes
            return Decimal(digits) * Decimal(_SUFFIX[suffix])
        return Decimal(digits) * Decimal(10) ** int(suffix[1:])
    except (ArithmeticError, ValueError) as e:  # decimal.Overflow is no InvalidOperation
        raise ValueError(f"not a quantity: {value!r}") from e


def _non_negative_quantity(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return False
    try:
        return quantity(value) >= 0
    except ValueError:
        return False


def re2(pattern: str) -> str:
    # CEL string literals are single-quoted; escape backslashes once more inside them.
    return pattern.replace("\\", "\\\\")


def cel_list(values: Iterable[str]) -> str:
    """A CEL list literal of strings, sorted (a stable CRD whatever the set's order)."""
    return "[" + ", ".join(f"'{value}'" for value in sorted(values)) + "]"


def cel_role_k(role: str) -> str:
    """CEL for a role's numSpeculativeTokens: its own override, else spec.speculative's."""
    return (
        f"(has(self.{role}.speculative) ? self.{role}.speculative.numSpeculativeTokens : "
        "self.speculative.numSpeculativeTokens)"
    )


def found(pattern: str, value: str) -> bool:
    """Whether the RE2 `pattern` matches somewhere in `value`, as CEL's `matches` does: Python's
    `$` also matches before a final newline, RE2's only at the end, so it reads `\\Z` here."""
    return re.search(pattern.replace("$", r"\Z"), value) is not None


DOT_DOT_SEGMENT: Final = r"(^|/)\.\.(/|$)"
"""A '..' path segment (RE2; Python checks it with `found`)."""


def sub_path_rule(path: str) -> Rule:
    """A path inside a volume or image: relative, without '..' segments (it could leave it)."""
    return Rule(
        f"!self.startsWith('/') && !self.matches('{re2(DOT_DOT_SEGMENT)}')",
        f"{path} is a relative path inside the volume, without '..'",
        lambda value: not value.startswith("/") and not found(DOT_DOT_SEGMENT, value),
    )


def name_rule(path: str, pattern: str, what: str, max_length: int) -> Rule:
    """A string field that must match `pattern` (for names, keys and values)."""
    check = matches(pattern)
    return Rule(
        f"size(self) <= {max_length} && self.matches('{re2(pattern)}')",
        f"{path} must be {what}, at most {max_length} characters",
        lambda value: isinstance(value, str) and len(value) <= max_length and check(value),
    )


def image_rule(path: str) -> Rule:
    check = matches(IMAGE_REFERENCE)
    return Rule(
        f"self.matches('{re2(IMAGE_REFERENCE)}')",
        f"{path} must be an image reference like registry.example.com/org/image:tag "
        "(lower-case path, no spaces)",
        check,
    )


def quantities_rule(path: str) -> Rule:
    """Every value of a resource map is a non-negative quantity (e.g. 4, 500m, 64Gi)."""
    return Rule(
        "self.all(k, type(self[k]) == int ? self[k] >= 0 : "
        "(isQuantity(self[k]) && quantity(self[k]).compareTo(quantity('0')) >= 0))",
        f"{path} values must be non-negative Kubernetes quantities such as 4, 500m or 64Gi",
        lambda value: all(_non_negative_quantity(v) for v in value.values()),
    )


def _extended(name: str) -> bool:
    # Kubernetes' IsExtendedResourceName: a domain-prefixed name outside kubernetes.io.
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def _whole(value: Any) -> bool:
    try:
        return quantity(value) == quantity(value).to_integral_value()
    except (ValueError, TypeError):
        return True  # not a quantity: quantities_rule says so


def extended_resources_rule(path: str) -> Rule:
    """Extended resources (nvidia.com/gpu, example.com/foo) are counted in whole units."""
    return Rule(
        "self.all(k, !k.contains('/') || k.contains('kubernetes.io/') || "
        "k.startsWith('requests.') || type(self[k]) == int || "
        "!isQuantity(self[k]) || quantity(self[k]).isInteger())",
        f"{path} values of extended resources such as nvidia.com/gpu must be whole numbers",
        lambda value: all(not _extended(k) or _whole(q) for k, q in value.items()),
    )


def keys_rule(path: str, pattern: str, what: str) -> Rule:
    check = matches(pattern)
    return Rule(
        f"self.all(k, size(k) <= 316 && k.matches('{re2(pattern)}'))",
        f"{path} keys must be {what}",
        lambda value: all(len(k) <= 316 and check(k) for k in value),
    )


def label_values_rule(path: str) -> Rule:
    check = matches(LABEL_VALUE)
    return Rule(
        f"self.all(k, self[k].matches('{re2(LABEL_VALUE)}'))",
        f"{path} values must be label values: at most 63 letters, digits, '-', '_' or '.', "
        "starting and ending with a letter or digit",
        lambda value: all(check(v) for v in value.values()),
    )


def _cel_quantity(value: str) -> str:
    # A map value is an int or a quantity string; string() reads both as the quantity's text.
    return f"quantity(string({value}))"


def _within_limit(request: Any, limit: Any) -> bool:
    try:
        return quantity(request) <= quantity(limit)
    except (ValueError, TypeError):
        return True  # not a quantity: quantities_rule says so


def requests_within_limits_rule(path: str) -> Rule:
    """A request above its own limit: the API server refuses the rendered container
    (`must be less than or equal to ... limit`); refuse the spec instead, in these words."""
    request, limit = "self.requests[k]", "self.limits[k]"
    return Rule(
        "!has(self.requests) || !has(self.limits) || self.requests.all(k, !(k in self.limits) || "
        f"!isQuantity(string({request})) || !isQuantity(string({limit})) || "
        f"{_cel_quantity(request)}.compareTo({_cel_quantity(limit)}) <= 0)",
        f"{path}.requests must not exceed {path}.limits for the same resource (the API server "
        "refuses a container whose request is above its limit)",
        lambda res: all(
            _within_limit(q, res.limits[k]) for k, q in res.requests.items() if k in res.limits
        ),
    )
