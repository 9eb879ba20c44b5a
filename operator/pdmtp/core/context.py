"""One reconcile's context: what the shell observed for a PDDeployment (`Observed`), and the
`Context` built from it once (`context_of`): the PDDeployment as validated, its children read
once for every step, and the clock. Immutable; the steps that would otherwise take its parts
one by one (steering, a revision's writes, the status) take it whole."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pdmtp.api import vocabulary as v
from pdmtp.api.status import PDDeploymentStatus
from pdmtp.api.v1alpha1 import PDDeployment, PDDeploymentSpec
from pdmtp.core.actions import key_of
from pdmtp.core.agreement import Agreement
from pdmtp.core.groups.grouping import Group, groups_of, units
from pdmtp.core.objects import Obj, annotations_of, format_time, labels_of
from pdmtp.core.render.history import Recorded, recorded
from pdmtp.core.windows import PodMetrics


@dataclass(frozen=True)
class Observed:
    """What the shell observed for one PDDeployment."""

    pdd: Obj
    deployments: Sequence[Obj] = ()
    pods: Sequence[Obj] = ()
    others: Sequence[Obj] = ()
    """The PDDeployment's other watched children: every kind in `pdmtp.api.kinds.WATCHED` but
    Deployment and Pod (Services, ServiceAccounts, NetworkPolicies, ControllerRevisions,
    PDRoleScales, PodGroups, PodDisruptionBudgets), labelled with its name."""
    metrics: Mapping[str, PodMetrics] = field(default_factory=dict)
    """The engine pods' latest scrapes by pod name (with spec.autoscaling, or a
    spec.verification.mode other than Off)."""
    workload_api: str | None = None
    """The Workload API version the API server serves (`scheduling.k8s.io/v1beta1`, ...), None
    when it serves none: a multi-node spec is refused then (`others` then holds no PodGroup)."""
    cordoned: frozenset[str] = frozenset()
    """Nodes marked unschedulable (a drain under way): engine pods on them are moved first."""


@dataclass(frozen=True, kw_only=True)
class Context:
    pdd: PDDeployment
    agreement: Agreement
    generation: int | None
    old: PDDeploymentStatus
    """The status as stored, parsed."""
    now: float
    stamp: str
    """`now` as status timestamps write it."""
    raw_old: Obj = field(default_factory=dict)
    """The status as stored, to tell whether a new one changes it."""
    promoted: str | None = None
    """The revision promoted by hand (`pdmtp.io/promote`)."""
    deployments: Sequence[Obj] = ()
    raw_pods: Sequence[Obj] = ()
    pods: Sequence[Obj] = ()
    """`raw_pods` with each multi-node group as one unit (`grouping.units`): what the planner
    counts."""
    groups: Sequence[Group] = ()
    others: Sequence[Obj] = ()
    """Every other watched child (see `Observed.others`)."""
    existing: Mapping[str, Obj] = field(default_factory=dict)
    """The Deployments and `others` by key (`actions.key_of`): what rendering diffs against."""
    history: Sequence[Recorded] = ()
    metrics: Mapping[str, PodMetrics] = field(default_factory=dict)
    workload_api: str | None = None
    cordoned: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        return self.pdd.metadata.name

    @property
    def spec(self) -> PDDeploymentSpec:
        return self.pdd.spec


def context_of(
    observed: Observed,
    pdd: PDDeployment,
    agreement: Agreement,
    old: PDDeploymentStatus,
    raw_status: Obj,
    generation: int | None,
    now: float,
) -> Context:
    """This PDDeployment's children out of what was observed, read once for every step."""
    name = pdd.metadata.name

    def mine(objs: Sequence[Obj], kind: str | None = None) -> list[Obj]:
        return [
            o
            for o in objs
            if labels_of(o).get(v.LABEL_NAME) == name and (kind is None or o.get("kind") == kind)
        ]

    raw_pods = mine(observed.pods)
    pod_groups = mine(observed.others, v.POD_GROUP_KIND)
    deployments = mine(observed.deployments)
    existing = {key_of({**o, "kind": "Deployment"}): o for o in deployments}
    existing.update({key_of(o): o for o in observed.others})
    return Context(
        pdd=pdd,
        agreement=agreement,
        generation=generation,
        old=old,
        raw_old=raw_status,
        now=now,
        stamp=format_time(now),
        promoted=annotations_of(observed.pdd).get(v.ANNOTATION_PROMOTE),
        deployments=deployments,
        raw_pods=raw_pods,
        # A multi-node group counts as one replica: the core reads units (`grouping`).
        pods=units(raw_pods, pod_groups),
        groups=groups_of(raw_pods, pod_groups),
        others=observed.others,
        existing=existing,
        history=recorded(observed.others, name),
        metrics=observed.metrics,
        workload_api=observed.workload_api,
        cordoned=observed.cordoned,
    )
