"""Leader election over a `coordination.k8s.io/v1` Lease, as pure decisions.

Why a Lease of our own rather than kopf's peering: kopf's peering keeps KopfPeering objects (CRDs
of its own) and pauses the lower-priority operator while a higher one is seen; it has no expiry a
standby can take over on and no fence, and kopf watches nothing for pdmtp anyway (the reflectors
do). A Lease is what kube-controller-manager and controller-runtime elect on, needs no CRD, and
`kubectl get lease` shows who leads.

The rules, as client-go's leader election keeps them:

- A candidate takes a Lease that does not exist, that names no holder (released), or whose record
  has not changed for its `leaseDurationSeconds` as *this process* saw it: the time is counted on
  the local monotonic clock from when the record was first seen as it is, never from the
  holder's `renewTime` (another host's clock).
- The holder renews every retry period. It leads only until `renew_deadline` after the start of
  its last successful renewal: past that its fence closes and it writes nothing. The deadline is
  shorter than the lease, so a holder that was paused or cut off stops writing before anyone may
  take its Lease.
- Every write of the Lease is conditional on the resourceVersion it was decided on (two
  candidates never both win: the second gets 409 and looks again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

LEASE_API_VERSION = "coordination.k8s.io/v1"


@dataclass(frozen=True)
class Timing:
    """client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry period."""

    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_seconds < self.renew_deadline_seconds < self.lease_seconds:
            raise ValueError(
                "leader election needs 0 < retry < renew deadline < lease duration, got "
                f"{self.retry_seconds} / {self.renew_deadline_seconds} / {self.lease_seconds}"
            )


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says, as read."""

    holder: str
    """Empty: nobody holds it (never taken, or released)."""
    lease_seconds: float
    acquire_time: str
    renew_time: str
    transitions: int
    resource_version: str

    @property
    def version(self) -> tuple[str, str, str]:
        """What changes whenever the holder acts: a renewal, a take-over, a release."""
        return (self.holder, self.acquire_time, self.renew_time)


def record_of(lease: Mapping[str, Any], default_seconds: float) -> LeaseRecord:
    spec = lease.get("spec") or {}
    meta = lease.get("metadata") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        lease_seconds=float(spec.get("leaseDurationSeconds") or default_seconds),
        acquire_time=str(spec.get("acquireTime") or ""),
        renew_time=str(spec.get("renewTime") or ""),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str(meta.get("resourceVersion") or ""),
    )


@dataclass(frozen=True)
class Sighting:
    """A record, and when (monotonic seconds) this process first saw it as it is."""

    record: LeaseRecord
    since: float


def sight(previous: Sighting | None, record: LeaseRecord, now: float) -> Sighting:
    """The sighting after reading `record` at `now`: the clock restarts only when the record
    changed (its holder acted), not when it was merely read again."""
    if previous is not None and previous.record.version == record.version:
        return Sighting(record, previous.since)  # same record: the newest resourceVersion
    return Sighting(record, now)


@dataclass(frozen=True)
class Write:
    """Create (`create`) or replace the Lease with `body`; a replace is conditional on the
    resourceVersion in the body."""

    body: dict[str, Any]
    create: bool
    taking: bool
    """A take-over (or first take), not a renewal of our own."""


@dataclass(frozen=True)
class Follow:
    """Another process leads: look again after a retry period."""

    holder: str
    expires_in: float
    """Seconds until this process may take the Lease if the holder stays silent."""


def micro_time(at: datetime) -> str:
    """A Lease's MicroTime (RFC 3339 with microseconds, UTC)."""
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_body(
    namespace: str,
    name: str,
    spec: Mapping[str, Any],
    resource_version: str = "",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": LEASE_API_VERSION, "kind": "Lease", "metadata": meta, "spec": dict(spec)}


def next_move(
    sighting: Sighting | None,
    me: str,
    namespace: str,
    name: str,
    timing: Timing,
    now: float,
    wall: datetime,
) -> Write | Follow:
    """What `me` does with the Lease `namespace/name` seen as `sighting` (None: it does not
    exist), at monotonic `now` and wall-clock `wall`."""
    stamp = micro_time(wall)
    duration = round(timing.lease_seconds)
    if sighting is None:
        spec = {
            "holderIdentity": me,
            "leaseDurationSeconds": duration,
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": 0,
        }
        return Write(lease_body(namespace, name, spec), create=True, taking=True)
    record = sighting.record
    if record.holder == me:
        spec = {
            "holderIdentity": me,
            "leaseDurationSeconds": duration,
            "acquireTime": record.acquire_time or stamp,
            "renewTime": stamp,
            "leaseTransitions": record.transitions,
        }
        body = lease_body(namespace, name, spec, record.resource_version)
        return Write(body, create=False, taking=False)
    expires_in = sighting.since + record.lease_seconds - now
    if record.holder and expires_in > 0:
        return Follow(record.holder, expires_in)
    spec = {
        "holderIdentity": me,
        "leaseDurationSeconds": duration,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": record.transitions + 1,
    }
    return Write(lease_body(namespace, name, spec, record.resource_version), False, taking=True)


def release(
    record: LeaseRecord, me: str, namespace: str, name: str, wall: datetime
) -> Write | None:
    """On a clean stop, hand the Lease back so a standby takes it at its next look rather than
    after a whole lease duration (None: it is not ours to release)."""
    if record.holder != me:
        return None
    spec = {
        "holderIdentity": None,
        "leaseDurationSeconds": 1,
        "acquireTime": record.acquire_time or None,
        "renewTime": micro_time(wall),
        "leaseTransitions": record.transitions,
    }
    return Write(lease_body(namespace, name, spec, record.resource_version), False, taking=False)
