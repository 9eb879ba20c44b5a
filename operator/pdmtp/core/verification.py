"""Each revision's verdict from what its decode pods reported, and what the verdict holds back.

`verdicts` sums every revision's decode pods (a multi-node group through its leader, the only
rank that serves and reports) over their lifetime and judges it (`core.verdict`): a revision
against the most established other revision that serves, the serving revision against the
spec's expected acceptance alone, and so a revision that drafts differently from the serving
one (accepted tokens per draft grow with numSpeculativeTokens). The backoff a revision is held
to is the one its own decode pods were started with (their `PDMTP_EXPECTED_PREFILL_BACKOFF`):
an old revision is judged by the lookahead it was rendered for, not by the spec's.

`gate` turns the spec's mode and the update revision's verdict into what the rollout does: fail
(roll back) on Failed, hold the old revision and an auto-promoting canary until Verified.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdmtp.api import vocabulary as v
from pdmtp.api.status import VerificationStatus
from pdmtp.api.v1alpha1 import VerificationSpec
from pdmtp.core.observe import labels_of, name_of
from pdmtp.core.planner import RevisionState, establishment
from pdmtp.core.scaling import PodMetrics
from pdmtp.core.verdict import Handoff, Outcome, Rules, Verdict, judge, lifetime

Obj = Mapping[str, Any]


def rules_of(spec: VerificationSpec, expected_backoff: int | None) -> Rules:
    return Rules(
        expected_backoff=expected_backoff,
        min_requests=spec.min_requests,
        min_drafts=spec.min_drafts,
        acceptance_tolerance=spec.acceptance_tolerance_percent / 100,
        expected_acceptance=spec.expected_acceptance_length,
    )


def _reporting_decodes(pods: Iterable[Obj], revision: str) -> list[Obj]:
    return [
        p
        for p in pods
        if labels_of(p).get(v.LABEL_REVISION) == revision
        and labels_of(p).get(v.LABEL_ROLE) == "decode"
        and labels_of(p).get(v.LABEL_GROUP_RANK, "0") == "0"
    ]


def expected_backoff(decode_pods: Iterable[Obj]) -> int | None:
    """The backoff the pods were rendered with (the first that says), None when none does."""
    for pod in decode_pods:
        for container in (pod.get("spec") or {}).get("containers") or []:
            for env in container.get("env") or []:
                if env.get("name") == v.ENV_EXPECTED_BACKOFF:
                    try:
                        return int(env.get("value", ""))
                    except ValueError:
                        return None
    return None


def speculative_config(decode_pods: Iterable[Obj]) -> str | None:
    """The `--speculative-config` the pods were started with (the first that has one)."""
    for pod in decode_pods:
        for container in (pod.get("spec") or {}).get("containers") or []:
            args = [str(a) for a in container.get("args") or []]
            if "--speculative-config" in args[:-1]:
                return args[args.index("--speculative-config") + 1]
    return None


def verdicts(
    spec: VerificationSpec,
    states: Sequence[RevisionState],
    pods: Sequence[Obj],
    metrics: Mapping[str, PodMetrics],
) -> dict[str, Verdict]:
    """The verdict on every revision with workloads ({} with mode Off)."""
    if spec.mode == "Off":
        return {}
    serving = [s for s in states if s.serving]
    anchor = max(serving, key=establishment).revision if serving else None
    handoffs: dict[str, Handoff] = {}
    backoffs: dict[str, int | None] = {}
    drafting: dict[str, str | None] = {}
    for s in states:
        decodes = _reporting_decodes(pods, s.revision)
        handoffs[s.revision] = lifetime(m for p in decodes if (m := metrics.get(name_of(p))))
        backoffs[s.revision] = expected_backoff(decodes)
        drafting[s.revision] = speculative_config(decodes)

    def reference(revision: str) -> Handoff | None:
        # Accepted tokens per draft grow with the tokens drafted: a revision is compared with
        # the serving one only where both draft alike (else with expectedAcceptanceLength).
        if anchor is None or revision == anchor or drafting[revision] != drafting[anchor]:
            return None
        return handoffs[anchor]

    return {
        s.revision: judge(
            handoffs[s.revision], reference(s.revision), rules_of(spec, backoffs[s.revision])
        )
        for s in states
    }


@dataclass(frozen=True)
class Gate:
    """What the update revision's verdict does to its rollout."""

    failure: str | None = None
    """Why the revision failed its verdict (the rollout fails as on its deadline); None if not."""
    finding: str | None = None
    """The failed verdict's reason (a Verified condition reason)."""
    awaiting: str | None = None
    """Why the old revision keeps its last pods (mode Gate, not Verified yet); None if free."""
    verified: bool = False
    """An auto-promoting canary may go on."""


def gate(spec: VerificationSpec, verdict: Verdict | None) -> Gate:
    if spec.mode in ("Off", "Report") or verdict is None:
        return Gate(verified=verdict is not None and verdict.outcome == Outcome.VERIFIED)
    if verdict.outcome == Outcome.FAILED:
        return Gate(
            failure=f"verification failed ({verdict.finding}): {verdict.message}",
            finding=verdict.finding.value,
        )
    if verdict.outcome == Outcome.VERIFIED:
        return Gate(verified=True)
    if spec.mode == "Gate":
        return Gate(awaiting=f"not Verified yet ({verdict.finding}): {verdict.message}")
    return Gate()


def as_status(verdict: Verdict) -> VerificationStatus:
    h = verdict.handoff
    acceptance = h.acceptance
    return VerificationStatus(
        verdict=verdict.outcome.value,
        reason=verdict.finding.value,
        message=verdict.message,
        decode_pods=h.reporting_pods,
        requests=round(h.requests),
        pulled_tokens=round(h.pulled_tokens),
        recomputed_tokens=round(h.backoff_tokens),
        expected_backoff=verdict.expected_backoff,
        failed_pulls=round(h.failed),
        decode_only=round(h.decode_only),
        drafts=round(h.drafts),
        acceptance_length=None if acceptance is None else round(acceptance, 3),
    )
