"""Which revisions the operator sends its own requests through, so that they can be judged.

A revision is judged on what its decodes did (`core.verification.verdict`): with no traffic there is
nothing to judge, and a canary deployed at night, or a Gate rollout, would wait for clients. So
while a revision's verdict says it awaits requests or drafts, the operator sends it small
completions of its own, through one of the revision's own Ready router pods (not the client Service,
which spreads over every serving revision), at most `spec.verification.probeRequestsPerMinute`, one
at a time. A revision whose router, prefill or decode is not Ready gets none: a probe must never
be the first request a half-started revision sees, nor count as its failure.

A revision being rolled to is judged against the serving revision over the same span
(`core.verification.revisions`): were only one of them probed, a probe's prompt (which drafts as
it drafts, not as the clients' traffic does) would weigh on one side of the comparison alone. So
while any other revision awaits, the current revision is probed at the same rate.

Pure: the PDDeployment's spec and status, its pods, when each revision was last probed, and the
clock in; the probes due out. The shell sends them (`pdmtp.probe`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.api.v1alpha1 import VerificationSpec
from pdmtp.core.objects import Obj, labels_of, name_of, pod_ready, pod_url, serves

AWAITING = frozenset({reasons.AWAITING_REQUESTS, reasons.AWAITING_DRAFTS})
"""The verdict reasons that more requests resolve."""
PROMPT = (
    "pdmtp verification probe: the operator asks this revision for a short completion so that "
    "its decode pulls a prefill's KV and drafts a few tokens, and the hand-off can be judged."
)
"""Long enough that the prefill computes more than any MTP backoff and the decode pulls KV."""
MAX_TOKENS = 16
"""Enough decode steps for a few MTP drafts, few enough to cost nothing."""


@dataclass(frozen=True)
class Probe:
    revision: str
    router: str
    """The router pod the request goes through."""
    url: str
    body: Mapping[str, Any]


def awaiting(status: Obj) -> list[str]:
    """The revisions whose verdict waits for requests or drafts (status.revisions), or that of a
    role-local roll held inside them (status.templateRolls: its router lists both templates)."""
    out = []
    for r in status.get("revisions") or []:
        verification = r.get("verification") or {}
        if verification.get("verdict") == "Pending" and verification.get("reason") in AWAITING:
            out.append(str(r.get("revision", "")))
    for roll in status.get("templateRolls") or []:
        revision = str(roll.get("revision", ""))
        held = roll.get("phase") == "Judging" and roll.get("reason") in AWAITING
        if held and revision not in out:
            out.append(revision)
    return out


def probed(status: Obj) -> list[str]:
    """The revisions to probe: those awaiting (`awaiting`), and the current revision while
    another awaits (the reference it is compared with draws on the same probes)."""
    waiting = awaiting(status)
    current = status.get("currentRevision")
    if current and waiting and current not in waiting:
        return [*waiting, str(current)]
    return waiting


def due(
    spec: VerificationSpec,
    model: str,
    status: Obj,
    pods: Sequence[Obj],
    last: Mapping[str, float],
    now: float,
) -> list[Probe]:
    """The probes to send now: one per Ready revision to probe (`probed`) whose last probe
    (`last`, by revision) is at least a minute / probeRequestsPerMinute ago."""
    if spec.mode == "Off" or spec.probe_requests_per_minute == 0:
        return []
    every = 60.0 / spec.probe_requests_per_minute
    out = []
    for revision in probed(status):
        if now - last.get(revision, float("-inf")) < every:
            continue
        mine = [p for p in pods if labels_of(p).get(v.LABEL_REVISION) == revision]
        router = _router(mine)
        if router is None or not all(_serving(mine, role) for role in v.ENGINE_ROLES):
            continue
        ip = str((router.get("status") or {}).get("podIP"))
        out.append(
            Probe(
                revision,
                name_of(router),
                f"{pod_url(ip, v.ROUTER_HTTP_PORT)}/v1/completions",
                {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS},
            )
        )
    return out


def _router(pods: Iterable[Obj]) -> Obj | None:
    """The revision's first Ready router pod with an address."""
    ready = [
        p
        for p in pods
        if labels_of(p).get(v.LABEL_ROLE) == "router"
        and pod_ready(p)
        and (p.get("status") or {}).get("podIP")
    ]
    return min(ready, key=name_of) if ready else None


def _serving(pods: Iterable[Obj], role: str) -> bool:
    return any(labels_of(p).get(v.LABEL_ROLE) == role and serves(p) for p in pods)
