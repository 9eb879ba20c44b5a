"""A role-local change judged as a new revision is.

A change to a role's local settings (env, extraArgs, resources, RDMA devices, pod settings; the
role hash, `core.revision`) gives that role's Deployment of the spec revision a new pod template,
which the Deployment controller rolls in place. Such a change can break the hand-off as surely as
a new revision (an env var that drops the fixed connector, a wrong RDMA device), so in modes
Rollback and Gate each roll is a `TemplateRoll`:

- **held at its first new pods** (`core.render.children.held`: a long `minReadySeconds`): a new
  pod serves once Ready, but the controller does not count it available, so it retires no old
  pod beyond what `maxUnavailable` allows (none by default) and starts no further new ones;
- **judged**: a decode template on its new pods against the old template's pods over the same
  span (`verdict.judge`, as a new revision against the serving one); a prefill template on every
  decode of the revision from its first new prefill's readiness on, against the absolute rules
  (which prefill served a pull is not known to the decode);
- Verified releases the hold; Failed takes the failed template's pods out of routing
  (`withdrawn`) and, once no router lists them, the Deployment back to the template that was
  Verified (rendered from the recorded spec that had it, `core.render.history`), until the
  role's settings change; no verdict within progressDeadlineSeconds goes on unverified (mode
  Rollback) or fails (mode Gate), as a revision's rollout does.

What a roll is comes from what is there, each reconcile: the Deployment's template and its pods'
role hashes (`pdmtp.io/role-hash`). Status only keeps what cannot be observed again: when the
roll started, the template it replaces, and a verdict once reached (a Verified roll is not held
again as its reference pods go, a Failed one is not retried).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from pdmtp.api import vocabulary as v
from pdmtp.api.status import TemplateRollPhase, TemplateRollStatus
from pdmtp.api.v1alpha1 import PDDeploymentSpec
from pdmtp.api.vocabulary import EngineRole
from pdmtp.core import names
from pdmtp.core.context import Context
from pdmtp.core.groups import podgroups
from pdmtp.core.objects import (
    Obj,
    annotations_of,
    format_time,
    is_leaving,
    is_terminating,
    labels_of,
    name_of,
    parse_time,
    pod_ready,
)
from pdmtp.core.pods import ready_since
from pdmtp.core.revision import hash_of
from pdmtp.core.verification.revisions import (
    expected_backoff,
    load_failure_policy,
    rules_of,
    started_speculative_config,
)
from pdmtp.core.verification.verdict import (
    Outcome,
    Reference,
    Verdict,
    evidence,
    judge,
    started,
)
from pdmtp.core.windows import PodMetrics


@dataclass(frozen=True)
class TemplateRoll:
    """One role's roll to a new pod template inside `revision`."""

    role: EngineRole
    revision: str
    template: str
    verified_template: str
    phase: TemplateRollPhase
    started_at: str
    reason: str = ""
    """The verdict's finding (a Verified condition reason)."""
    message: str = ""
    going_back: bool = True
    """Failed: its Deployment may go back now (False while a router still lists a pod of the
    failed template: it stays held until then)."""

    @property
    def held(self) -> bool:
        return self.phase == "Judging"

    @property
    def revert_to(self) -> str | None:
        """The role hash the Deployment goes back to now (a Failed roll)."""
        return self.verified_template if self.phase == "Failed" and self.going_back else None

    def still_listed(self) -> TemplateRoll:
        """This Failed roll while a router lists a pod of its template: held, not back yet."""
        return replace(self, going_back=False)

    def as_status(self) -> TemplateRollStatus:
        return TemplateRollStatus(
            role=self.role,
            revision=self.revision,
            template=self.template,
            verified_template=self.verified_template,
            phase=self.phase,
            started_at=self.started_at,
            reason=self.reason,
            message=self.message,
        )

    @classmethod
    def from_status(cls, s: TemplateRollStatus) -> TemplateRoll:
        return cls(s.role, s.revision, s.template, s.verified_template, s.phase, s.started_at,
                   s.reason, s.message)  # fmt: skip


def judged_pods(rolls: Sequence[TemplateRoll], pods: Sequence[Obj]) -> frozenset[str]:
    """The pods of a template held for its verdict or gone back from: their faults are their
    template's, answered by the verdict, not by replacing them one by one."""
    out: set[str] = set()
    for roll in rolls:
        if roll.phase in ("Judging", "Failed"):
            mine = _pods(pods, roll.revision, roll.role)
            out.update(name_of(p) for p in mine if role_hash_of(p) == roll.template)
    return frozenset(out)


def withdrawn(rolls: Sequence[TemplateRoll], pods: Sequence[Obj]) -> frozenset[str]:
    """The pods of a Failed template that leave routing before their role goes back (the
    Deployment controller deletes them then, faster than a router rolls): all of them, while a
    Ready pod of the Verified template serves in their place."""
    out: set[str] = set()
    for roll in rolls:
        if roll.phase != "Failed":
            continue
        mine = [p for p in _pods(pods, roll.revision, roll.role) if not is_terminating(p)]
        kept = [p for p in mine if role_hash_of(p) == roll.verified_template]
        if any(pod_ready(p) and not is_leaving(p) for p in kept):
            out.update(name_of(p) for p in mine if role_hash_of(p) == roll.template)
    return frozenset(out)


def role_hash_of(obj: Obj) -> str | None:
    """A pod's role hash, or a Deployment's template's."""
    if obj.get("kind") == "Deployment":
        spec = obj.get("spec")
        template = spec.get("template") if isinstance(spec, Mapping) else None
        obj = template if isinstance(template, Mapping) else {}
    return annotations_of(obj).get(v.ANNOTATION_ROLE_HASH)


def rolls(ctx: Context, revision: str | None) -> list[TemplateRoll]:
    """The template rolls of `revision` (the spec's) after this reconcile, one per single-node
    engine role whose Deployment exists (a role without one is created, not rolled), carried on
    from the rolls the status recorded."""
    spec = ctx.spec
    judged = spec.effective_verification.mode in ("Rollback", "Gate")
    if revision is None or not judged or not ctx.agreement.compatible:
        return []
    eff = ctx.agreement.settings
    # Each single-node role's role hash in the spec: what its Deployment's template rolls to.
    wanted = {
        r: hash_of(eff, r) for r in v.ENGINE_ROLES if podgroups.shape_of(ctx.agreement, r) is None
    }
    deployments = {
        r: d
        for r in wanted
        if (d := ctx.existing.get(f"Deployment/{names.workload(ctx.name, revision, r)}"))
    }
    pods, metrics, old, now = ctx.raw_pods, ctx.metrics, ctx.old.template_rolls or [], ctx.now
    out = []
    for role, template in wanted.items():
        deployment = deployments.get(role)
        if deployment is None:
            continue
        before = next((r for r in old if r.revision == revision and r.role == role), None)
        roll = _roll(
            spec, revision, role, template, deployment, pods, metrics,
            None if before is None else TemplateRoll.from_status(before), now,
        )  # fmt: skip
        if roll is not None:
            out.append(roll)
    return out


def _roll(
    spec: PDDeploymentSpec,
    revision: str,
    role: EngineRole,
    template: str,
    deployment: Obj,
    pods: Sequence[Obj],
    metrics: Mapping[str, PodMetrics],
    before: TemplateRoll | None,
    now: float,
) -> TemplateRoll | None:
    mine = [p for p in _pods(pods, revision, role) if not is_terminating(p)]
    others = Counter(h for p in mine if (h := role_hash_of(p)) is not None and h != template)
    rolling = bool(others)
    same = before is not None and before.template == template
    if same and before is not None and before.phase in ("Failed", "Verified", "Waived"):
        # A verdict reached is kept: a Failed template until the settings change, a Verified
        # or waived one while its roll goes on.
        return before if before.phase == "Failed" or rolling else None
    if not rolling and not same:
        return None  # every pod is of the spec's template: nothing rolls
    base: str | None = None
    if same and before is not None:
        base, since = before.verified_template, before.started_at
    else:
        base, since = _base(before, deployment, template, others), format_time(now)
    if base is None:
        return None  # no pod of another template is there to protect
    verdict = _judge(spec, revision, role, template, base, pods, metrics, parse_time(since))
    roll = TemplateRoll(role, revision, template, base, "Judging", since, verdict.finding.value,
                        f"{role} template {template}: {verdict.message}")  # fmt: skip
    if verdict.outcome == Outcome.VERIFIED:
        return _with(roll, "Verified")
    if verdict.outcome == Outcome.FAILED:
        return _with(roll, "Failed", f"went back to template {base}: {verdict.message}")
    deadline = spec.rollout.progress_deadline_seconds
    if now - (parse_time(since) or now) <= deadline:
        return roll
    new = [p for p in mine if role_hash_of(p) == template]
    if spec.effective_verification.mode == "Rollback" and not all(map(pod_ready, new)):
        # Pods that never came up have no verdict to waive: the roll stays held, their
        # failure in Degraded and waitingFor (a revision's rollout fails its deadline then).
        return roll
    late = f"no verdict within progressDeadlineSeconds ({deadline} s): {verdict.message}"
    if spec.effective_verification.mode == "Gate":
        return _with(roll, "Failed", f"went back to template {base}: {late}")
    return _with(roll, "Waived", f"rolls on unverified: {late}")


def _with(roll: TemplateRoll, phase: TemplateRollPhase, why: str = "") -> TemplateRoll:
    message = f"{roll.role} template {roll.template} {why}" if why else roll.message
    return TemplateRoll(roll.role, roll.revision, roll.template, roll.verified_template, phase,
                        roll.started_at, roll.reason, message)  # fmt: skip


def _base(
    before: TemplateRoll | None, deployment: Obj, template: str, others: Counter[str]
) -> str | None:
    """The template a new roll replaces: the one a superseded roll replaced (a template never
    judged is no reference), else the Deployment's, else the most common one among the pods."""
    if before is not None:
        settled = before.phase in ("Verified", "Waived")
        return before.template if settled else before.verified_template
    current = role_hash_of(deployment)
    if current is not None and current != template:
        return current
    return min(others, key=lambda h: (-others[h], h)) if others else None


def _pods(pods: Iterable[Obj], revision: str, role: str) -> list[Obj]:
    return [
        p
        for p in pods
        if labels_of(p).get(v.LABEL_REVISION) == revision and labels_of(p).get(v.LABEL_ROLE) == role
    ]


def _judge(
    spec: PDDeploymentSpec,
    revision: str,
    role: EngineRole,
    template: str,
    base: str,
    pods: Sequence[Obj],
    metrics: Mapping[str, PodMetrics],
    rolled: float | None,
) -> Verdict:
    decodes = [p for p in _pods(pods, revision, "decode") if v.LABEL_GROUP not in labels_of(p)]
    if role == "decode":
        new = [p for p in decodes if role_hash_of(p) == template]
        old = [p for p in decodes if role_hash_of(p) == base]
    else:
        new, old = decodes, []
    rules = rules_of(spec.effective_verification, expected_backoff(new), load_failure_policy(new))
    scraped = [m for p in new if (m := metrics.get(name_of(p)))]
    if role == "prefill":
        # Every decode pulls from old and new prefills alike: judge what they did since the
        # first new prefill could serve (since the roll began where readiness has no time), on
        # the absolute rules.
        new_prefills = [p for p in _pods(pods, revision, "prefill") if role_hash_of(p) == template]
        if not any(pod_ready(p) for p in new_prefills):
            return judge(evidence(()), None, rules)
        since = _first_ready(new_prefills) or rolled
        return judge(evidence(scraped, since, first=False), None, rules)
    reference = None
    theirs = [m for p in old if (m := metrics.get(name_of(p)))]
    if theirs:
        alike = started_speculative_config(new) == started_speculative_config(old)
        reference = Reference(evidence(theirs, started(scraped), first=False), alike)
    return judge(evidence(scraped), reference, rules)


def _first_ready(pods: Iterable[Obj]) -> float | None:
    """When the first of the Ready pods became Ready."""
    times = [parse_time(ready_since(p)) for p in pods if pod_ready(p)]
    return min((t for t in times if t is not None), default=None)
