"""Each revision's verdict from what its decode pods reported, and what the verdict holds back.

`verdicts` judges every revision on its decode pods' windows (`core.windows`; a multi-node group
through its leader, the only rank that serves and reports), `core.verification.verdict`:

- the revision the spec rolls to, beside others, on every window its decodes have: its failed
  and decode-only pulls against the most established serving revision's over the same span (from
  the rolled-to revision's first window on), its acceptance against that revision's where both
  draft alike (accepted tokens per draft grow with numSpeculativeTokens), else against the spec's
  expected acceptance;
- a revision that rolled out (alone, or older than the one rolled to) on whether it still hands
  KV over: its failed and decode-only pulls over each decode's last windows against an absolute
  ceiling (so a recovered blip stops counting), its acceptance against the spec's expected value.

The backoff a revision is held to is the one its own decode pods were started with (their
`PDMTP_EXPECTED_PREFILL_BACKOFF`), and the failure policy the one their `--kv-transfer-config`
names (vLLM's default, fail, where it names none): an old revision is judged by what it was
rendered with, not by the spec.

`rollout_gate` turns the spec's mode and the update revision's verdict into what the rollout does:
fail (roll back) on Failed; hold the old revision's last pods until there is a verdict (mode
Rollback, up to the progress deadline, then the rollout goes on unverified) or until Verified (mode
Gate, a deadline passed fails it); hold an auto-promoting canary until Verified.

`replacements` picks the serving decode pods whose KV receives keep failing: each is marked
(`pdmtp.io/replace`, which says why) and moved as a pod on a cordoned node is, its replacement
first (`core.rollout.evacuation`). One pod of a revision at a time: a fault that is the revision's
or the prefill's (every new pod fails too) then costs one pod start per round, not the whole role,
and the revision's Verified condition and the alert already say so.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence

from pdmtp.api import vocabulary as v
from pdmtp.api.status import VerificationStatus
from pdmtp.api.v1alpha1 import VerificationSpec
from pdmtp.core.objects import (
    Obj,
    annotations_of,
    created_at,
    is_leaving,
    is_terminating,
    labels_of,
    name_of,
    parse_time,
    pod_ready,
)
from pdmtp.core.revision_state import Gate, RevisionState, establishment
from pdmtp.core.verification.verdict import (
    Handoff,
    LoadFailurePolicy,
    Outcome,
    Reference,
    Rules,
    Verdict,
    evidence,
    judge,
    recent,
    started,
)
from pdmtp.core.windows import PodMetrics


def rules_of(
    spec: VerificationSpec,
    expected_backoff: int | None,
    load_failure_policy: LoadFailurePolicy = "fail",
) -> Rules:
    return Rules(
        expected_backoff=expected_backoff,
        false_rollback=spec.false_rollback,
        smallest_regression=spec.smallest_regression,
        min_requests=spec.min_requests,
        min_drafts=spec.min_drafts,
        expected_acceptance=spec.expected_acceptance_length,
        load_failure_policy=load_failure_policy,
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


def started_speculative_config(decode_pods: Iterable[Obj]) -> str | None:
    """The `--speculative-config` the pods were started with (the first that has one)."""
    return _flag(decode_pods, "--speculative-config")


def load_failure_policy(decode_pods: Iterable[Obj]) -> LoadFailurePolicy:
    """What the pods do with a failed KV load: their `--kv-transfer-config`'s
    kv_load_failure_policy (the first pod that has the flag), else vLLM's default, fail."""
    config = _flag(decode_pods, "--kv-transfer-config")
    try:
        policy = json.loads(config or "{}").get("kv_load_failure_policy")
    except (ValueError, AttributeError):
        policy = None
    return "recompute" if policy == "recompute" else v.VLLM_KV_LOAD_FAILURE_POLICY


def _flag(decode_pods: Iterable[Obj], flag: str) -> str | None:
    for pod in decode_pods:
        for container in (pod.get("spec") or {}).get("containers") or []:
            args = [str(a) for a in container.get("args") or []]
            if flag in args[:-1]:
                return args[args.index(flag) + 1]
    return None


def verdicts(
    spec: VerificationSpec,
    states: Sequence[RevisionState],
    pods: Sequence[Obj],
    metrics: Mapping[str, PodMetrics],
    update: str | None = None,
) -> dict[str, Verdict]:
    """The verdict on every revision with workloads ({} with mode Off); `update` is the
    revision the spec rolls to."""
    if spec.mode == "Off":
        return {}
    serving = [s for s in states if s.serving]
    anchor = max(serving, key=establishment).revision if serving else None
    decodes = {s.revision: _reporting_decodes(pods, s.revision) for s in states}
    scraped = {
        revision: [m for p in mine if (m := metrics.get(name_of(p)))]
        for revision, mine in decodes.items()
    }
    out: dict[str, Verdict] = {}
    for s in states:
        mine = scraped[s.revision]
        rules = rules_of(
            spec, expected_backoff(decodes[s.revision]), load_failure_policy(decodes[s.revision])
        )
        if len(states) == 1 or s.revision != update:
            # A revision that rolled out proved itself then; now the question is whether it
            # still hands KV over: its last windows, so a crashed prefill (the pulls in flight
            # to it) stops counting once clean windows follow.
            out[s.revision] = judge(evidence(mine), None, rules, failures=recent(mine))
            continue
        reference = None
        if anchor is not None and anchor != s.revision:
            # The serving revision over the same span: traffic that changes over the day
            # changes both alike. Its first window is its life before the operator saw it.
            since = started(mine)
            theirs = evidence(scraped[anchor], since, first=False)
            alike = started_speculative_config(decodes[s.revision]) == started_speculative_config(
                decodes[anchor]
            )
            reference = Reference(theirs, alike)
        out[s.revision] = judge(evidence(mine), reference, rules)
    return out


def rollout_gate(spec: VerificationSpec, verdict: Verdict | None) -> Gate:
    if spec.mode in ("Off", "Report") or verdict is None:
        return Gate(verified=verdict is not None and verdict.outcome == Outcome.VERIFIED)
    if verdict.outcome == Outcome.FAILED:
        return Gate(
            failure=f"verification failed ({verdict.finding}): {verdict.message}",
            finding=verdict.finding.value,
        )
    if verdict.outcome == Outcome.VERIFIED:
        return Gate(verified=True)
    awaiting = f"not Verified yet ({verdict.finding}): {verdict.message}"
    return Gate(awaiting=awaiting, release_at_deadline=spec.mode == "Rollback")


def marked(pods: Iterable[Obj]) -> dict[str, str]:
    """The live engine pods already being replaced, and why (their `pdmtp.io/replace` mark)."""
    return {
        name_of(p): why
        for p in pods
        if (why := annotations_of(p).get(v.ANNOTATION_REPLACE)) is not None
        and not is_terminating(p)
    }


def replacements_of(pods: Iterable[Obj]) -> dict[str, str]:
    """The decode pods to tag as replacements (`pdmtp.io/replacement-of`), each with the pod it
    replaces: those of a replaced pod's revision created since its mark and not tagged yet."""
    out: dict[str, str] = {}
    live = [p for p in pods if not is_terminating(p)]
    for old in live:
        since = parse_time(annotations_of(old).get(v.ANNOTATION_REPLACE_SINCE))
        if since is None or v.ANNOTATION_REPLACE not in annotations_of(old):
            continue
        revision = labels_of(old).get(v.LABEL_REVISION)
        for p in live:
            labels, notes = labels_of(p), annotations_of(p)
            created = created_at(p)
            if (
                labels.get(v.LABEL_REVISION) == revision
                and labels.get(v.LABEL_ROLE) == "decode"
                and v.ANNOTATION_REPLACE not in notes
                and v.ANNOTATION_REPLACEMENT_OF not in notes
                and created is not None
                and created >= since
            ):
                out.setdefault(name_of(p), name_of(old))
    return out


def replacements(
    spec: VerificationSpec,
    states: Sequence[RevisionState],
    pods: Sequence[Obj],
    metrics: Mapping[str, PodMetrics],
    failed_revision: str | None = None,
    exempt: Collection[str] = (),
) -> dict[str, str]:
    """The decode pods to start replacing now, and why: Ready, routed, single-node pods of a
    serving revision (not one being rolled back) whose KV receives failed at least
    `replaceAfterFailedPulls` times, and at least as often as they succeeded, between their two
    latest scrapes; at most one per revision, and none in a revision that is replacing one
    already. A pod that is itself a replacement (`pdmtp.io/replacement-of`) is not replaced
    again: failing as the pod it replaced did, the fault is the revision's, and replacing it
    would only churn (the revision's Verified condition stays False instead). Nor is an
    `exempt` pod (a new template's, judged as a whole: `core.verification.templates`). Modes
    Rollback and Gate only."""
    if spec.mode not in ("Rollback", "Gate") or spec.replace_after_failed_pulls == 0:
        return {}
    already = marked(pods)
    busy = {labels_of(p).get(v.LABEL_REVISION) for p in pods if name_of(p) in already}
    serving = {s.revision for s in states if s.serving and s.revision != failed_revision}
    out: dict[str, str] = {}
    for pod in sorted(pods, key=name_of):
        labels = labels_of(pod)
        revision = labels.get(v.LABEL_REVISION)
        if (
            revision not in serving
            or revision in busy
            or labels.get(v.LABEL_ROLE) != "decode"
            or v.LABEL_GROUP in labels
            or is_terminating(pod)
            or is_leaving(pod)
            or not pod_ready(pod)
            or v.ANNOTATION_REPLACEMENT_OF in annotations_of(pod)
            or name_of(pod) in exempt
        ):
            continue
        scrapes = metrics.get(name_of(pod))
        window = recent([scrapes], last=1) if scrapes is not None else Handoff()
        succeeded = window.exposure - window.failed
        # Most of its pulls failed, not a few among many: a peer that crashed costs the pulls
        # in flight to it, and its routers move on; a decode that cannot pull keeps failing.
        if window.failed >= spec.replace_after_failed_pulls and window.failed >= succeeded:
            failing = (
                "each failed its request"
                if load_failure_policy([pod]) == "fail"
                else "each recomputed by the decode"
            )
            out[name_of(pod)] = (
                f"{window.failed:g} KV receive(s) failed ({failing}) and {succeeded:g} "
                f"request(s) went well between its two latest scrapes (replaceAfterFailedPulls "
                f"{spec.replace_after_failed_pulls})"
            )
            busy.add(revision)
    return out


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
        windows=round(h.sample.windows),
        acceptance_length=None if acceptance is None else round(acceptance, 3),
    )
