"""spec.autoscaling: how each engine role follows its load (issue 22), as pydantic models.

Each role is driven by one source, never two:

- `Operator` (the default): the operator scrapes the role's engines (their metrics-only port) and
  decides with `pdmtp.core.scaling.autoscaler`, on the targets given here (or the role's defaults).
- `External`: an HPA, KEDA or `kubectl scale` drives the role through its `PDRoleScale` object
  (`<name>-<role>`, a scale subresource), which the operator creates for External roles only. An
  Operator role has no scale endpoint, so nothing outside can fight its scaler; the fields that
  only the operator's scaler reads (targets, behavior, tolerance) are refused on an External role.

Either way the operator keeps the count within minReplicas/maxReplicas and the prefill:decode
ratio band, and a rollout in progress takes the new count without restarting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import ConfigDict, Field

from pdmtp.api.base import Model
from pdmtp.api.corev1 import ListMap
from pdmtp.api.rules import Rule, cel_list, cel_role_k, model_rules
from pdmtp.api.vocabulary import EngineRole

T = TypeVar("T")


class Signal(StrEnum):
    """A load signal read off the engines' own metrics; the value is what a spec's target names."""

    WAITING_PER_POD = "waitingRequestsPerPod"
    QUEUE_TIME = "queueTimeSeconds"
    TIME_TO_FIRST_TOKEN = "timeToFirstTokenSeconds"
    KV_CACHE_USAGE = "kvCacheUsage"
    RUNNING_PER_POD = "runningRequestsPerPod"
    INTER_TOKEN_LATENCY = "interTokenLatencySeconds"
    DECODE_TOKENS_PER_POD = "decodeTokensPerSecondPerPod"


Source = Literal["Operator", "External"]
OPERATOR: Source = "Operator"
EXTERNAL: Source = "External"


FRACTION_SIGNALS = (Signal.KV_CACHE_USAGE,)
"""Signals that are a fraction 0..1 (vllm:kv_cache_usage_perc is one, despite its name)."""
SPEC_DECODE_SIGNALS = (Signal.DECODE_TOKENS_PER_POD,)
"""Signals read off vLLM's spec-decode counters, which only a speculating decode moves."""


@dataclass(frozen=True)
class Default(Generic[T]):
    """One default of spec.autoscaling, the only place its value is written: the model's field
    default, the CRD's description ("Default: ..."), the scaler and the README's table read it."""

    field: str
    """The field under spec.autoscaling as the CRD spells it; `<role>` stands for prefill and
    decode, `<direction>` for scaleUp and scaleDown."""
    value: T
    meaning: str
    """What the default does and why it is this value."""
    case: str = ""
    """When it applies, where a field has one default per case."""

    @property
    def shown(self) -> str:
        """The value as a reader would write it."""
        return _shown(self.value)

    @property
    def wire(self) -> Any:
        """The value as the API server holds it (JSON, camelCase)."""
        if isinstance(self.value, tuple):
            return [_wire(item) for item in self.value]
        return _wire(self.value)

    @property
    def sentence(self) -> str:
        case = f" ({self.case})" if self.case else ""
        return f"Default{case}: {self.shown}."

    @property
    def description(self) -> str:
        return f"{self.meaning} {self.sentence}"


def _wire(value: object) -> Any:
    if isinstance(value, Model):
        return value.model_dump(by_alias=True, exclude_none=True, mode="json")
    return str(value) if isinstance(value, StrEnum) else value


def _shown(value: object) -> str:
    if isinstance(value, tuple):
        return ", ".join(_shown(item) for item in value)
    if isinstance(value, SignalTarget):
        return f"{value.signal} {value.value:g}"
    if isinstance(value, Model):
        return "{" + ", ".join(f"{k}: {v:g}" for k, v in _wire(value).items()) + "}"
    return f"{value:g}" if isinstance(value, float) else str(value)


FRACTION_RULE = Rule(
    f"!(self.signal in {cel_list(FRACTION_SIGNALS)}) || self.value <= 1.0",
    "spec.autoscaling.<role>.targets: "
    + ", ".join(FRACTION_SIGNALS)
    + " is a fraction of the KV cache (0..1, vllm:kv_cache_usage_perc): write 0.8, not 80",
    lambda target: target.signal not in FRACTION_SIGNALS or target.value <= 1,
)


class SignalTarget(Model):
    """One signal and the value per pod (or per request) the role should run at."""

    RULES = (FRACTION_RULE,)
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    # Not strict: the wire carries the enum's string value.
    signal: Signal = Field(
        strict=False, description='The signal (docs/guide.md, "Autoscaling": what each one reads).'
    )
    value: float = Field(
        ge=1e-6,
        le=1e9,
        description="Target value: per Ready pod for the per-pod signals, seconds for latencies.",
    )


PERIOD = Default(
    "<role>.behavior.<direction>.periodSeconds", 60, "The period the step limits count over."
)


class ScalingRules(Model):
    """One direction of HPA-style behavior: a stabilisation window and step limits."""

    stabilization_window_seconds: int = Field(
        ge=0,
        le=3600,
        description=(
            "Seconds over which the lowest (scale-up) or highest (scale-down) recommendation is "
            "used: a short spike or dip does not move the count."
        ),
    )
    period_seconds: int = Field(default=PERIOD.value, ge=1, le=1800, description=PERIOD.description)
    max_pods: int | None = Field(
        default=None, ge=1, le=1000, description="At most this many pods per period."
    )
    max_percent: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="At most this percent of the pods per period (the larger limit applies).",
    )

    def limits_or(self, default: ScalingRules) -> ScalingRules:
        """This direction, with the default's step limits and period when it sets no limit of
        its own (an HPA behavior without policies keeps the default ones too)."""
        if self.max_pods is not None or self.max_percent is not None:
            return self
        window = self.stabilization_window_seconds
        return default.model_copy(update={"stabilization_window_seconds": window})


SCALE_UP = Default(
    "<role>.behavior.scaleUp",
    ScalingRules(stabilization_window_seconds=30, max_pods=2, max_percent=100),
    "A load must stay high for the whole window (one noisy scrape does not buy a GPU pod), then "
    "the larger of the two steps a period: an engine takes minutes to load its weights, so a "
    "bigger step only piles up pending pods.",
)
SCALE_DOWN = Default(
    "<role>.behavior.scaleDown",
    ScalingRules(stabilization_window_seconds=300, max_pods=1),
    "HPA's window: a dip must last all of it; then slow steps, since each removal drains its "
    "pod's requests.",
)


class Behavior(Model):
    """Stabilisation and step limits per direction; an omitted direction keeps its defaults, and
    a direction without maxPods or maxPercent keeps its default step limits."""

    scale_up: ScalingRules | None = Field(default=None, description=SCALE_UP.description)
    scale_down: ScalingRules | None = Field(default=None, description=SCALE_DOWN.description)


_OPERATOR_ONLY = ("targets", "behavior", "tolerance", "expectedAcceptanceLength")

EXTERNAL_FIELDS_RULE = Rule(
    "self.source != 'External' || (" + " && ".join(f"!has(self.{f})" for f in _OPERATOR_ONLY) + ")",
    "spec.autoscaling.<role>: targets, behavior, tolerance and expectedAcceptanceLength are read "
    "by the operator's own scaler (source: Operator); a role with source: External is scaled "
    "through its PDRoleScale by an HPA, whose metrics and behavior are its own: remove them or "
    "set source: Operator",
    lambda role: (
        role.source != EXTERNAL
        or (
            all(getattr(role, f) is None for f in ("targets", "behavior", "tolerance"))
            and role.expected_acceptance_length is None
        )
    ),
)
MIN_MAX_RULE = Rule(
    "self.minReplicas <= self.maxReplicas",
    "spec.autoscaling.<role>.minReplicas must be <= maxReplicas",
    lambda role: role.min_replicas <= role.max_replicas,
)
TOKENS_NEED_ACCEPTANCE_RULE = Rule(
    "!has(self.targets) || !self.targets.exists(t, t.signal == 'decodeTokensPerSecondPerPod') "
    "|| has(self.expectedAcceptanceLength)",
    "spec.autoscaling.<role>: the decodeTokensPerSecondPerPod target is the tokens a pod "
    "sustains at a known MTP acceptance: set expectedAcceptanceLength (accepted tokens per "
    "draft in your benchmark)",
    lambda role: (
        role.targets is None
        or all(t.signal != Signal.DECODE_TOKENS_PER_POD for t in role.targets)
        or role.expected_acceptance_length is not None
    ),
)


TARGETS_GIVEN_RULE = Rule(
    "!has(self.targets) || size(self.targets) > 0",
    "spec.autoscaling.<role>.targets is empty: no signal could ever move the role; list at "
    "least one target, or omit targets for the role's defaults",
    lambda role: role.targets is None or len(role.targets) > 0,
)


SOURCE: Default[Source] = Default(
    "<role>.source",
    OPERATOR,
    "Operator: the operator's scaler decides from the engines' metrics. External: an HPA/KEDA "
    "(or kubectl scale) sets the role's PDRoleScale (`<name>-<role>`); the operator keeps it "
    "within min/max and the ratio band.",
)
TOLERANCE = Default(
    "<role>.tolerance",
    0.1,
    "No signal moves the count while observed/target is within 1 +- this (HPA's band).",
)
PREFILL_TARGETS = Default(
    "<role>.targets",
    (
        SignalTarget(signal=Signal.WAITING_PER_POD, value=4.0),
        SignalTarget(signal=Signal.QUEUE_TIME, value=0.5),
    ),
    "A prefill runs each prompt once and hands it on: arrivals beyond it first grow its queue; "
    "queue time is the part of TTFT that more pods remove.",
    case="prefill",
)
DECODE_TARGETS = Default(
    "<role>.targets",
    (
        SignalTarget(signal=Signal.KV_CACHE_USAGE, value=0.8),
        SignalTarget(signal=Signal.RUNNING_PER_POD, value=32.0),
        SignalTarget(signal=Signal.INTER_TOKEN_LATENCY, value=0.05),
    ),
    "A decode holds every running request's KV (a full cache preempts and recomputes), its batch "
    "sets its token rate, and ITL is what a user feels (keep it above an idle engine's ITL).",
    case="decode",
)
MTP_DECODE_TARGETS = Default(
    "<role>.targets",
    (SignalTarget(signal=Signal.DECODE_TOKENS_PER_POD, value=2000.0),),
    "Tokens per second one decode pod sustains at expectedAcceptanceLength: a placeholder, to "
    "replace with a benchmark's figure.",
    case="decode with expectedAcceptanceLength, in addition",
)
TARGET_DEFAULTS = (PREFILL_TARGETS, DECODE_TARGETS, MTP_DECODE_TARGETS)


def default_targets(
    role: EngineRole, expected_acceptance_length: float | None
) -> tuple[SignalTarget, ...]:
    """A role's targets when its spec names none (a decode told its MTP acceptance also sizes on
    the tokens it emits)."""
    if role == "prefill":
        return PREFILL_TARGETS.value
    if expected_acceptance_length is None:
        return DECODE_TARGETS.value
    return DECODE_TARGETS.value + MTP_DECODE_TARGETS.value


class RoleAutoscaling(Model):
    """How one engine role scales."""

    RULES = (MIN_MAX_RULE, EXTERNAL_FIELDS_RULE, TOKENS_NEED_ACCEPTANCE_RULE, TARGETS_GIVEN_RULE)
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    source: Source = Field(default=SOURCE.value, description=SOURCE.description)
    min_replicas: int = Field(ge=1, le=1000, description="Never fewer pods than this.")
    max_replicas: int = Field(ge=1, le=1000, description="Never more pods than this.")
    targets: Annotated[list[SignalTarget], ListMap("signal")] | None = Field(
        default=None,
        max_length=7,
        description=" ".join(
            [
                "Signals and their targets; the largest count any of them asks for wins.",
                *(row.sentence for row in TARGET_DEFAULTS),
            ]
        ),
    )
    behavior: Behavior | None = Field(
        default=None, description="Stabilisation windows and step limits, as HPA's behavior."
    )
    tolerance: float | None = Field(
        default=None,
        ge=0,
        le=0.99,
        description=TOLERANCE.description,
    )
    expected_acceptance_length: float | None = Field(
        default=None,
        ge=0,
        le=64,
        description=(
            "MTP: accepted tokens per draft at which decodeTokensPerSecondPerPod's target was "
            "measured; the target is scaled by (1 + observed) / (1 + this)."
        ),
    )

    def signal_targets(self, role: EngineRole) -> dict[Signal, float]:
        """The target per signal the operator's scaler reads: those written, else the role's
        defaults; none for an External role, whose HPA has its own."""
        if self.source == EXTERNAL:
            return {}
        written = None if self.targets is None else tuple(self.targets)
        chosen = written or default_targets(role, self.expected_acceptance_length)
        return {target.signal: target.value for target in chosen}

    def scale_up_rules(self) -> ScalingRules:
        written = None if self.behavior is None else self.behavior.scale_up
        return (written or SCALE_UP.value).limits_or(SCALE_UP.value)

    def scale_down_rules(self) -> ScalingRules:
        written = None if self.behavior is None else self.behavior.scale_down
        return (written or SCALE_DOWN.value).limits_or(SCALE_DOWN.value)

    def effective_tolerance(self) -> float:
        return TOLERANCE.value if self.tolerance is None else self.tolerance


class RatioBand(Model):
    """prefill replicas / decode replicas stays within [min, max]."""

    RULES = (
        Rule(
            "self.min <= self.max",
            "spec.autoscaling.ratio.min must be <= spec.autoscaling.ratio.max",
            lambda band: band.min <= band.max,
        ),
    )
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    min: float = Field(ge=0.001, le=1000, description="Lowest prefill:decode ratio, e.g. 0.25.")
    max: float = Field(ge=0.001, le=1000, description="Highest prefill:decode ratio, e.g. 2.")


def replica_bounds(spec: Any, role: str) -> tuple[int, int]:
    """A role's min/max replicas; a role without autoscaling keeps its replicas."""
    scaling = getattr(spec.autoscaling, role)
    if scaling is None:
        replicas: int = getattr(spec, role).replicas
        return replicas, replicas
    return scaling.min_replicas, scaling.max_replicas


def exact(number: float) -> Fraction:
    """The decimal a spec wrote (the shortest repr of its float), exactly: what the scaler
    compares ratios with (0.07 x 100 is 7, where binary floating point makes it 7.000...01)."""
    return Fraction(repr(number))


def band_reachable(spec: Any) -> bool:
    """Some whole pair (prefill, decode) within both roles' bounds lies inside the band."""
    ratio = spec.autoscaling.ratio
    if ratio is None:
        return True
    low, high = exact(ratio.min), exact(ratio.max)
    (p_low, p_high), (d_low, d_high) = (
        replica_bounds(spec, "prefill"),
        replica_bounds(spec, "decode"),
    )
    return any(
        max(p_low, math.ceil(low * decode)) <= min(p_high, math.floor(high * decode))
        for decode in range(d_low, d_high + 1)
    )


def _cel_bounds(role: str) -> tuple[str, str]:
    scaling = f"self.autoscaling.{role}"
    fixed = f"self.{role}.replicas"
    return (
        f"(has({scaling}) ? {scaling}.minReplicas : {fixed})",
        f"(has({scaling}) ? {scaling}.maxReplicas : {fixed})",
    )


_P_MIN, _P_MAX = _cel_bounds("prefill")
_D_MIN, _D_MAX = _cel_bounds("decode")
BAND_SLACK = 1e-7
BAND_REACHABLE_RULE = Rule(
    # CEL cannot loop over the counts, so the API server checks the band against the real
    # interval (a necessary condition); `pdmtp validate`, the webhook and the operator check
    # whole pairs (`band_reachable`, exact decimals), and the operator's status names a band no
    # pair satisfies. CEL has doubles only: 0.07 * 100.0 is 7.000000000000001, which would refuse
    # a band the scaler reaches. With counts <= 1000 a product's rounding error is below 1e-9,
    # and for ratios of up to 6 decimals an exact product above a count exceeds it by >= 1e-6, so
    # comparing with BAND_SLACK (1e-7) makes the interval test exact for such ratios (the ratio
    # bounds allow 0.001 steps; more decimals only loosen the necessary condition further).
    "!has(self.autoscaling) || !has(self.autoscaling.ratio) || ("
    f"self.autoscaling.ratio.min * double({_D_MIN}) <= double({_P_MAX}) + {BAND_SLACK} && "
    f"double({_P_MIN}) <= self.autoscaling.ratio.max * double({_D_MAX}) + {BAND_SLACK})",
    "spec.autoscaling.ratio: no prefill and decode counts within the roles' minReplicas/"
    "maxReplicas (a role without autoscaling keeps its replicas) give a prefill:decode ratio "
    "inside [min, max]: widen the band or the bounds",
    lambda spec: spec.autoscaling is None or band_reachable(spec),
)


def _reads_spec_decode(scaling: RoleAutoscaling | None) -> bool:
    """The role's scaler reads the spec-decode counters (or is told an acceptance for them)."""
    if scaling is None:
        return False
    targets = scaling.targets or []
    signals = any(t.signal in SPEC_DECODE_SIGNALS for t in targets)
    return signals or scaling.expected_acceptance_length is not None


def _cel_reads_spec_decode(scaling: str) -> str:
    return (
        f"has({scaling}) && ((has({scaling}.targets) && {scaling}.targets.exists(t, t.signal in "
        f"{cel_list(SPEC_DECODE_SIGNALS)})) || has({scaling}.expectedAcceptanceLength))"
    )


_SPEC_DECODE_WORDS = " and ".join(SPEC_DECODE_SIGNALS) + " (with expectedAcceptanceLength)"
PREFILL_SPEC_DECODE_RULE = Rule(
    f"!({_cel_reads_spec_decode('self.prefill')})",
    f"spec.autoscaling.prefill: {_SPEC_DECODE_WORDS} read vLLM's spec-decode counters, which a "
    "prefill pod never moves (it hands each prompt on after its first token, drafting nothing): "
    "the signal would never report; use it on spec.autoscaling.decode",
    lambda auto: not _reads_spec_decode(auto.prefill),
)
STALENESS_RULE = Rule(
    "self.staleAfterSeconds > self.intervalSeconds",
    "spec.autoscaling.staleAfterSeconds must be greater than intervalSeconds: a pod is scraped "
    "once per interval, so a shorter staleness window finds its last scrape stale before the "
    "next one lands, and a role never scales down",
    lambda auto: auto.stale_after_seconds > auto.interval_seconds,
)


INTERVAL = Default(
    "intervalSeconds",
    15,
    "Seconds between two scrapes and decisions (the windowed means span one).",
)
STALE_AFTER = Default(
    "staleAfterSeconds",
    60,
    "A pod's scrape older than this counts as missing: no scale-down on it.",
)


class AutoscalingSpec(Model):
    """Per-role autoscaling within a prefill:decode band."""

    RULES = (PREFILL_SPEC_DECODE_RULE, STALENESS_RULE)
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    prefill: RoleAutoscaling | None = Field(
        default=None, description="The prefill role; unset keeps spec.prefill.replicas."
    )
    decode: RoleAutoscaling | None = Field(
        default=None, description="The decode role; unset keeps spec.decode.replicas."
    )
    ratio: RatioBand | None = Field(
        default=None,
        description="prefill:decode replicas no decision may leave (min/max replicas win).",
    )
    interval_seconds: int = Field(
        default=INTERVAL.value, ge=1, le=600, description=INTERVAL.description
    )
    stale_after_seconds: int = Field(
        default=STALE_AFTER.value, ge=1, le=3600, description=STALE_AFTER.description
    )

    def role(self, role: str) -> RoleAutoscaling | None:
        scaling: RoleAutoscaling | None = getattr(self, role)
        return scaling


def _decode_k(spec: Any) -> int | None:
    """The decode role's numSpeculativeTokens (its override first); None without speculation."""
    if spec.speculative is None:
        return None
    override = spec.decode.speculative
    k: int = (override or spec.speculative).num_speculative_tokens
    return k


_DECODE = "self.autoscaling.decode"
SPEC_DECODE_NEEDS_SPECULATIVE_RULE = Rule(
    f"!has(self.autoscaling) || has(self.speculative) || !({_cel_reads_spec_decode(_DECODE)})",
    f"spec.autoscaling.decode: {_SPEC_DECODE_WORDS} read vLLM's spec-decode counters, which an "
    "engine without speculative decoding (spec.speculative unset) does not export: the signal "
    "would never report; set spec.speculative or use another signal",
    lambda spec: (
        spec.autoscaling is None
        or spec.speculative is not None
        or not _reads_spec_decode(spec.autoscaling.decode)
    ),
)
ACCEPTANCE_WITHIN_K_RULE = Rule(
    # vLLM counts accepted draft tokens per draft (spec_decode_num_accepted_tokens /
    # spec_decode_num_drafts, the bonus token not included): at most k of the k drafted.
    f"!has(self.autoscaling) || !has({_DECODE}) || !has({_DECODE}.expectedAcceptanceLength) || "
    f"!has(self.speculative) || {_DECODE}.expectedAcceptanceLength <= double("
    f"{cel_role_k('decode')})",
    "spec.autoscaling.decode.expectedAcceptanceLength counts accepted draft tokens per draft "
    "(vLLM's spec_decode_num_accepted_tokens / spec_decode_num_drafts, the bonus token not "
    "included): it cannot exceed the decode role's numSpeculativeTokens (k, "
    "spec.decode.speculative's or spec.speculative's)",
    lambda spec: (
        spec.autoscaling is None
        or spec.autoscaling.decode is None
        or spec.autoscaling.decode.expected_acceptance_length is None
        or (k := _decode_k(spec)) is None
        or spec.autoscaling.decode.expected_acceptance_length <= k
    ),
)
AUTOSCALING_SPEC_RULES = (SPEC_DECODE_NEEDS_SPECULATIVE_RULE, ACCEPTANCE_WITHIN_K_RULE)
"""Rules over the whole spec (they read spec.speculative and the roles' k)."""


AUTOSCALING_DEFAULTS: tuple[Default[Any], ...] = (
    INTERVAL,
    STALE_AFTER,
    SOURCE,
    *TARGET_DEFAULTS,
    TOLERANCE,
    SCALE_UP,
    SCALE_DOWN,
    PERIOD,
)
"""Every default of spec.autoscaling, in the order the README lists them."""


def defaults_markdown() -> str:
    """The README's table of autoscaling defaults (rendered, never written by hand)."""
    lines = ["| field under `spec.autoscaling` | default | why |", "|---|---|---|"]
    for row in AUTOSCALING_DEFAULTS:
        case = f" ({row.case})" if row.case else ""
        cells = (f"`{row.field}`{case}", f"`{row.shown}`", row.meaning)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"
