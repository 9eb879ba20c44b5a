"""One reconcile's context: the PDDeployment as validated, what was observed of it, and the
clock. `reconcile.decide` builds it once; it is immutable, and the steps that would otherwise
take its parts one by one (steering, a revision's actions, the status) take it whole."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdmtp.api.status import PDDeploymentStatus
from pdmtp.api.v1alpha1 import PDDeployment, PDDeploymentSpec
from pdmtp.core.agreement import Agreement
from pdmtp.core.groups.grouping import Group
from pdmtp.core.render.history import Recorded
from pdmtp.core.scaling.roles import PodMetrics

Obj = Mapping[str, Any]


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
    """Every other watched child (see `reconcile.Observed.others`)."""
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
