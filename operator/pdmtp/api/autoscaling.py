"""spec.autoscaling: how each engine role follows its load (issue 22), as pydantic models.

Each role is driven by one source, never two:

- `Operator` (the default): the operator scrapes the role's engines (their metrics-only port) and
  decides with `pdmtp.core.autoscaling`, on the targets given here (or the role's defaults).
- `External`: an HPA, KEDA or `kubectl scale` drives the role through its `PDRoleScale` object
  (`<name>-<role>`, a scale subresource), which the operator creates for External roles only. An
  Operator role has no scale endpoint, so nothing outside can fight its scaler; the fields that
  only the operator's scaler reads (targets, behavior, tolerance) are refused on an External role.

Either way the operator keeps the count within minReplicas/maxReplicas and the prefill:decode
ratio band, and a rollout in progress takes the new count without restarting.
"""

from __future__ import annotations

import math
from enum import StrEnum
from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from pdmtp.api.base import Model
from pdmtp.api.corev1 import ListMap
from pdmtp.api.rules import Rule, cel_list, cel_role_k, model_rules


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


FRACTION_RULE = Rule(
    f"!(self.signal in {cel_list(FRACTION_SIGNALS)}) || self.value <= 1.0",
    "spec.autoscaling.<role>.targets: "
    + ", ".join(FRACTION_SIGNALS)
    + " is a fraction of the KV cache (0..1, vllm:kv_cache_usage_perc): write 0.8, not 80",
    lambda target: target.signal not in FRACTION_SIGNALS or target.value <= 1,
)


class Target(Model):
    """One signal and the value per pod (or per request) the role should run at."""

    RULES = (FRACTION_RULE,)
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    # Not strict: the wire carries the enum's string value.
    signal: Signal = Field(strict=False, description="The signal (README: Autoscaling).")
    value: float = Field(
        ge=1e-6,
        le=1e9,
        description="Target value: per Ready pod for the per-pod signals, seconds for latencies.",
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
    period_seconds: int = Field(
        default=60, ge=1, le=1800, description="The period the step limits count over."
    )
    max_pods: int | None = Field(
        default=None, ge=1, le=1000, description="At most this many pods per period."
    )
    max_percent: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="At most this percent of the pods per period (the larger limit applies).",
    )


class Behavior(Model):
    """Stabilisation and step limits per direction; an omitted direction keeps its defaults, and
    a direction without maxPods or maxPercent keeps its default step limits."""

    scale_up: ScalingRules | None = Field(
        default=None, description="Default: a 30 s window, then +2 pods or +100% a minute."
    )
    scale_down: ScalingRules | None = Field(
        default=None, description="Default: a 300 s window, then 1 pod a minute."
    )


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


class RoleAutoscaling(Model):
    """How one engine role scales."""

    RULES = (MIN_MAX_RULE, EXTERNAL_FIELDS_RULE, TOKENS_NEED_ACCEPTANCE_RULE, TARGETS_GIVEN_RULE)
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    source: Source = Field(
        default=OPERATOR,
        description=(
            "Operator: the operator's scaler decides from the engines' metrics. External: an "
            "HPA/KEDA (or kubectl scale) sets the PDRoleScale <name>-<role>; the operator keeps "
            "it within min/max and the ratio band."
        ),
    )
    min_replicas: int = Field(ge=1, le=1000, description="Never fewer pods than this.")
    max_replicas: int = Field(ge=1, le=1000, description="Never more pods than this.")
    targets: Annotated[list[Target], ListMap("signal")] | None = Field(
        default=None,
        max_length=7,
        description=(
            "Signals and their targets; the largest count any of them asks for wins. Omitted: the "
            "role's defaults (prefill: waitingRequestsPerPod 4, queueTimeSeconds 0.5; decode: "
            "kvCacheUsage 0.8, runningRequestsPerPod 32, interTokenLatencySeconds 0.05)."
        ),
    )
    behavior: Behavior | None = Field(
        default=None, description="Stabilisation windows and step limits, as HPA's behavior."
    )
    tolerance: float | None = Field(
        default=None,
        ge=0,
        le=0.99,
        description="No signal moves the count while observed/target is within 1 +- this (0.1).",
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


def _bounds(spec: Any, role: str) -> tuple[int, int]:
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
    (p_low, p_high), (d_low, d_high) = _bounds(spec, "prefill"), _bounds(spec, "decode")
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
        default=15,
        ge=1,
        le=600,
        description="Seconds between two scrapes and decisions (the windowed means span one).",
    )
    stale_after_seconds: int = Field(
        default=60,
        ge=1,
        le=3600,
        description="A pod's scrape older than this counts as missing: no scale-down on it.",
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
