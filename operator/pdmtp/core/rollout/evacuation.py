"""Engine pods on a cordoned node leave it as a planned scale-down would: replacement first.

`kubectl drain` cordons a node, then evicts its pods. An evicted engine starts terminating while
its routers still list it, and its replacement starts only then; if the routers' roll outlasts
the engine's preStop, requests fail. So where the rollout may surge, the engine budgets allow no
eviction (`core.render.budgets`), the drain waits, and the operator moves the pods itself:

1. **surge**: a (revision, role) with serving pods on a cordoned node asks for up to maxSurge more
   replicas while fewer pods off those nodes are Ready than the plan wants (the scheduler places
   them elsewhere: the node is unschedulable);
2. **remove**: once they are Ready, the plan's own count stands again, and the removal gate
   (`core.rollout.removal`) takes the difference, the cordoned node's pods first: out of the
   routers' lists, then the lowest deletion cost, then the replicas drop and the ReplicaSet deletes
   exactly them. The drain finds their node empty of engines and completes.

Multi-node groups are not moved (their budget allows one group at a time, and the operator
replaces a group whose member a drain evicted). Pure: no cluster, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pdmtp.api.vocabulary import ENGINE_ROLES, EngineRole
from pdmtp.core.revision_state import RevisionState
from pdmtp.core.rollout.planner import Policy, RevisionPlan
from pdmtp.core.rollout.removal import EnginePod


def evacuate(
    plans: Sequence[RevisionPlan],
    states: Sequence[RevisionState],
    engines: Sequence[EnginePod],
    policy: Policy,
) -> tuple[RevisionPlan, ...]:
    """The planner's step with surges for pods on cordoned nodes (see the module docstring).
    `engines` are the live (not terminating) engine pods; `states` count the terminating too,
    which hold their place under maxSurge until they are gone."""
    state_of = {s.revision: s for s in states}
    out = []
    for p in plans:
        state = state_of.get(p.revision)
        if p.delete or state is None:
            out.append(p)
            continue
        counts = {
            role: _replicas(
                p.replicas(role), state.role(role).pods, p.revision, role, engines, policy
            )
            for role in ENGINE_ROLES
        }
        out.append(replace(p, prefill=counts["prefill"], decode=counts["decode"]))
    return tuple(out)


def _replicas(
    want: int,
    pods: int,
    revision: str,
    role: EngineRole,
    engines: Sequence[EnginePod],
    policy: Policy,
) -> int:
    """As a rolling update with maxUnavailable 0 would move them: up to maxSurge replacements at
    a time, and a stranded pod removed only while the pods serving stay at `want` without it."""
    live = [e for e in engines if e.revision == revision and e.role == role]
    stranded = [e for e in live if e.evacuate]
    if not stranded or want == 0:
        return want
    serving_elsewhere = sum(e.ready and not e.leaving and not e.evacuate for e in live)
    # A broken pod (its pulls failing) is out of routing early, yet it still holds its place
    # until its replacement is Ready: the role must come back to `want` pods that serve.
    serving_stranded = sum(e.ready and (not e.leaving or e.broken) for e in stranded)
    # Out of routing already (the gate marked it), or not Ready: it serves nothing, it may go.
    idle = len(stranded) - serving_stranded
    spare = max(0, serving_elsewhere + serving_stranded - want)
    removable = idle + min(serving_stranded, spare)
    # Terminating pods still hold GPUs: the surge waits for them (want + maxSurge in all).
    terminating = max(0, pods - len(live))
    surge = min(len(stranded), policy.max_surge - terminating)
    return max(want, want + surge - removable)
