"""Whether the operator is live and ready, judged from what its watches see (`pdmtp.endpoints`
serves the verdict: `/healthz` for liveness, `/readyz` for readiness).

Ready: every PDDeployment scope is being watched, the child caches hold a full listing, and the
webhook (when on) knows the resource it admits. Live: none of those has been missing for longer
than a grace period. A PDDeployment watch that cannot be opened is retried without end, so a CRD
or an API server that comes back is served without help; the grace is the backstop that gets a
stuck process restarted rather than left running idle.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

GRACE_SECONDS = 120.0


@dataclass(frozen=True)
class Watch:
    """One reflector's state: is its watch open, since when (seconds ago), the last error."""

    resource: str
    scope: str
    watching: bool
    seconds: float
    error: str = ""


@dataclass(frozen=True)
class Health:
    live: bool
    ready: bool
    problems: tuple[str, ...] = ()
    watches: tuple[Watch, ...] = field(default=())
    leader: Mapping[str, object] | None = None
    """Leader election as this process sees it (None: run without election)."""

    def body(self) -> str:
        return json.dumps(
            {
                "live": self.live,
                "ready": self.ready,
                "problems": list(self.problems),
                "watches": [asdict(w) for w in self.watches],
                **({} if self.leader is None else {"leader": dict(self.leader)}),
            }
        )


def assess(
    watches: Sequence[Watch],
    children_synced: bool,
    workers_alive: bool,
    webhook_resolved: bool | None,
    uptime: float,
    grace: float = GRACE_SECONDS,
    leader: Mapping[str, object] | None = None,
) -> Health:
    """`watches`: the PDDeployment reflectors; `webhook_resolved` None when there is no
    webhook; `uptime`: seconds since the operator started. A standby is as ready as a leader
    (it takes over from warm caches; an operator Deployment rolling its pods must see the new
    one ready); `leader` only reports who leads."""
    problems: list[str] = []
    dead = False
    for w in watches:
        if not w.watching:
            why = f": {w.error}" if w.error else ""
            problems.append(f"{w.resource} in {w.scope} not watched for {w.seconds:.0f}s{why}")
            dead |= w.seconds >= grace
    if not children_synced:
        problems.append(f"child caches not synced after {uptime:.0f}s")
        dead |= uptime >= grace
    if webhook_resolved is False:
        problems.append("the webhook's resource is not resolved (kopf found no CRD for it)")
        dead |= uptime >= grace
    if not workers_alive:
        problems.append("a reconcile worker stopped")
        dead = True
    return Health(
        live=not dead,
        ready=not problems,
        problems=tuple(problems),
        watches=tuple(watches),
        leader=leader,
    )
