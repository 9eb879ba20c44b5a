"""The PodDisruptionBudget of each (revision, engine role): how many of its pods voluntary
disruptions (the evictions of a node drain) may take at once. Pure: no cluster, no clock.

A budget guards against evictions only. The operator never evicts: rollouts, scale-downs, the
removal gate's releases and rollbacks scale Deployments (the ReplicaSet deletes the pods) or delete
a group's pods and the retired revision's objects, and no budget is consulted for a delete. So a
budget never holds the operator's own moves, and a retiring revision's budget goes with it.

**How many.** `allowance(rollout)`: `spec.rollout.disruptionBudget.maxUnavailable` when set.
Else, for a single-node role whose rollout may surge (maxSurge >= 1, the default), 0: an evicted
engine would start terminating while its routers still list it, and its replacement would start
only then, so the budget refuses the eviction and the operator moves the pod itself, replacement
first, through the removal gate (`core.rollout.evacuation`); the drain retries its eviction until
the pod is gone, and then moves on. A drain therefore waits for the operator (two replicas elect a
leader, so one is there). Else (no surge, or a multi-node role) the rollout policy's
`maxUnavailable` (the availability floor), and at least 1: a budget of 0 there would hold a drain
forever, since nothing would bring up a replacement first. With 1, a drain takes one pod (one
group) per role and revision, the Deployment (or the operator, for a group) replaces it, and the
next eviction waits until the replacement is Ready. A role of one replica has nothing to spare:
such a drain takes it down until its replacement is Ready.

**Single-node roles: maxUnavailable.** The disruption controller counts it against the owning
Deployment's `spec.replicas`, so the budget follows every scale (the planner's, the autoscaler's,
an HPA's through a PDRoleScale) without being rewritten, and a pod the removal gate takes out
(`core.rollout.removal`) is not counted twice: the gate holds the Deployment's replicas until the
pod is released, so while it is leaving it is both expected and healthy, and then the replicas and
the pod go together (for the moment between the scale and the ReplicaSet's delete, milliseconds, the
released pod still counts as healthy).

**Multi-node roles: minAvailable, in pods, over the whole group.** A group's pods are owned by
the PDDeployment, which has no scale subresource, so the disruption controller cannot count a
maxUnavailable for them (it reports the budget failed and allows nothing). The budget selects
every pod of every group: evicting any member breaks its group (vLLM's ranks cannot rejoin), so a
budget over leaders alone would let a drain take every group's workers at once. One eviction
breaks at most one group, so an allowance of k groups is k pods: `minAvailable = pods - k`,
where pods = groups x nodes. A broken group's other members are deleted by the operator (not
evicted) and stop counting as healthy, so no further eviction is allowed until the replacement
group is Ready: at most k groups are down at once. The operator is the only writer of a group
count, so it rewrites minAvailable in the same step that creates or deletes groups (after the
deletes, in action order), and the removal gate holds the count until a group's pods go.

Unhealthy pods may always be evicted (`unhealthyPodEvictionPolicy: AlwaysAllow`): an engine that
is not Ready serves nothing, and a crash-looping revision must not hold a drain.
"""

from __future__ import annotations

from pdmtp.api import vocabulary as v
from pdmtp.api.v1alpha1 import PDDeployment, RolloutSpec
from pdmtp.api.vocabulary import EngineRole
from pdmtp.core import names
from pdmtp.core.objects import Manifest


def allowance(rollout: RolloutSpec, grouped: bool = False) -> int:
    """Pods (groups, for a multi-node role: `grouped`) per role and revision a drain may take at
    once: 0 where the operator moves the pods itself (`core.rollout.evacuation`)."""
    if rollout.disruption_budget is not None:
        return rollout.disruption_budget.max_unavailable
    if rollout.max_surge > 0 and not grouped:
        return 0
    return max(1, rollout.max_unavailable)


def disruption_budget_manifest(
    pdd: PDDeployment,
    revision: str,
    role: EngineRole,
    allowed: int,
    nodes: int | None = None,
    groups: int = 0,
) -> Manifest:
    """The budget of one (revision, engine role): `allowed` pods at once; for a multi-node role
    (`nodes` pods per group, `groups` of them planned) pods of at most `allowed` groups."""
    name = pdd.metadata.name
    spec: Manifest = {
        "selector": {"matchLabels": names.selector(name, revision, role)},
        "unhealthyPodEvictionPolicy": v.UNHEALTHY_POD_EVICTION_POLICY,
    }
    if nodes is None:
        spec["maxUnavailable"] = allowed
    else:
        spec["minAvailable"] = max(0, nodes * groups - allowed)
    return {
        "apiVersion": "policy/v1",
        "kind": v.DISRUPTION_BUDGET_KIND,
        "metadata": {
            "name": names.disruption_budget(name, revision, role),
            "namespace": pdd.metadata.namespace,
            "labels": names.pod_labels(name, revision, role),
            "ownerReferences": [names.owner_reference(pdd)],
        },
        "spec": spec,
    }
