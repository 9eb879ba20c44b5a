"""Leader election's decisions (`pdmtp.core.leadership`), and a simulation of several candidates
over one Lease, with pauses (SIGSTOP, a frozen VM) and slow requests, that checks the one promise
the fence makes: no two processes may write at the same instant.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pdmtp.core.leadership import (
    Follow,
    LeaseRecord,
    Sighting,
    Timing,
    Write,
    next_move,
    record_of,
    release,
    sight,
)

WALL = datetime(2026, 12, 3, 14, 0, 0, 123456, tzinfo=UTC)
TIMING = Timing()


def lease(holder: str, renew: str = "r1", transitions: int = 0, rv: str = "7") -> dict[str, Any]:
    spec = {
        "holderIdentity": holder,
        "leaseDurationSeconds": 15,
        "acquireTime": "a1",
        "renewTime": renew,
        "leaseTransitions": transitions,
    }
    return {"metadata": {"name": "pdmtp-operator", "resourceVersion": rv}, "spec": spec}


def seen(body: dict[str, Any], since: float) -> Sighting:
    return Sighting(record_of(body, TIMING.lease_seconds), since)


def move(sighting: Sighting | None, me: str = "me", now: float = 100.0) -> Write | Follow:
    return next_move(sighting, me, "ops", "pdmtp-operator", TIMING, now, WALL)


def test_a_missing_lease_is_created_by_its_first_candidate() -> None:
    m = move(None)
    assert isinstance(m, Write) and m.create and m.taking
    assert m.body["metadata"] == {"name": "pdmtp-operator", "namespace": "ops"}
    assert m.body["spec"] == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-12-03T14:00:00.123456Z",
        "renewTime": "2026-12-03T14:00:00.123456Z",
        "leaseTransitions": 0,
    }


def test_the_holder_renews_over_the_version_it_read_keeping_its_acquire_time() -> None:
    m = move(seen(lease("me", transitions=4), since=0.0))
    assert isinstance(m, Write) and not m.create and not m.taking
    assert m.body["metadata"]["resourceVersion"] == "7"
    assert m.body["spec"]["acquireTime"] == "a1"
    assert m.body["spec"]["leaseTransitions"] == 4
    assert m.body["spec"]["renewTime"] == "2026-12-03T14:00:00.123456Z"


@pytest.mark.parametrize(("since", "waits"), [(86.0, True), (85.01, True), (85.0, False)])
def test_another_holder_is_waited_for_until_its_record_is_a_lease_old(
    since: float, waits: bool
) -> None:
    m = move(seen(lease("other", transitions=2), since), now=100.0)
    if waits:
        assert m == Follow("other", pytest.approx(since + 15 - 100.0))
    else:
        assert isinstance(m, Write) and m.taking and not m.create
        assert m.body["metadata"]["resourceVersion"] == "7"  # conditional: one taker wins
        assert m.body["spec"]["holderIdentity"] == "me"
        assert m.body["spec"]["leaseTransitions"] == 3


def test_a_released_lease_is_taken_at_once() -> None:
    released = lease("")
    m = move(seen(released, since=100.0), now=100.0)
    assert isinstance(m, Write) and m.taking


def test_the_clock_restarts_only_when_the_record_changes() -> None:
    first = sight(None, record_of(lease("other", "r1", rv="7"), 15), now=10.0)
    again = sight(first, record_of(lease("other", "r1", rv="7"), 15), now=20.0)
    assert again.since == 10.0
    renewed = sight(again, record_of(lease("other", "r2", rv="8"), 15), now=21.0)
    assert renewed.since == 21.0
    # A resourceVersion alone (a label edited by someone) is no sign of life from the holder,
    # but the newest version is what the next conditional write must name.
    relabelled = sight(renewed, record_of(lease("other", "r2", rv="9"), 15), now=30.0)
    assert relabelled.since == 21.0 and relabelled.record.resource_version == "9"


def test_release_hands_back_only_its_own_lease() -> None:
    mine = record_of(lease("me", transitions=1), 15)
    m = release(mine, "me", "ops", "pdmtp-operator", WALL)
    assert m is not None and m.body["spec"]["holderIdentity"] is None
    assert m.body["spec"]["leaseDurationSeconds"] == 1
    assert m.body["metadata"]["resourceVersion"] == "7"
    assert release(record_of(lease("other"), 15), "me", "ops", "pdmtp-operator", WALL) is None


@pytest.mark.parametrize("bad", [(15, 15, 2), (15, 10, 10), (15, 20, 2), (15, 10, 0)])
def test_timing_keeps_the_renew_deadline_inside_the_lease(bad: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="retry < renew deadline < lease duration"):
        Timing(*bad)


# ---- simulation: candidates, one API server, pauses ------------------------------------------


@dataclass
class Server:
    """The Lease as the API server keeps it: a conditional replace needs the current version."""

    body: dict[str, Any] | None = None
    version: int = 0

    def write(self, body: dict[str, Any], create: bool) -> dict[str, Any] | None:
        """The stored object, or None for a 409."""
        if create:
            if self.body is not None:
                return None
        elif self.body is None or body["metadata"].get("resourceVersion") != str(self.version):
            return None
        self.version += 1
        self.body = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        return self.body


@dataclass
class Candidate:
    name: str
    wake: float = 0.0
    paused_until: float = 0.0
    sighting: Sighting | None = None
    fence_until: float = float("-inf")
    leading: bool = False
    opened_at: float | None = None
    reigns: list[tuple[float, float]] = field(default_factory=list)

    def close(self, at: float) -> None:
        if self.opened_at is not None:
            self.reigns.append((self.opened_at, min(at, self.fence_until)))
        self.opened_at, self.leading, self.fence_until = None, False, float("-inf")


@dataclass(frozen=True)
class Run:
    reigns: list[tuple[float, float, str]]
    """(fence opened, fence closed, candidate), in order of opening."""
    overlaps: list[str]


def simulate(timing: Timing, seed: int, candidates: int = 3, seconds: float = 400.0) -> Run:
    """Run the candidates as `pdmtp.election.Elector` runs (read, decide, write after a random
    latency, the fence open until the renew deadline after the start of the last successful
    renewal, a loss closes it) on one clock, with random pauses of up to three leases; report
    every reign and every overlap of two fences."""
    rng = random.Random(seed)
    server = Server()
    procs = [Candidate(f"c{i}", wake=rng.uniform(0, 2)) for i in range(candidates)]
    dt = 0.05
    now = 0.0
    while now < seconds:
        now = round(now + dt, 4)
        for p in procs:
            if p.opened_at is not None and now >= p.fence_until:
                p.close(now)  # the fence closes on its own clock, paused or not
            if rng.random() < 0.002:  # SIGSTOP
                p.paused_until = now + rng.uniform(0, 3 * timing.lease_seconds)
            if now < p.paused_until or now < p.wake:
                continue
            started = now
            latency = rng.uniform(0, 0.8)
            if server.body is not None:
                record = record_of(server.body, timing.lease_seconds)
                p.sighting = sight(p.sighting, record, now)
                if p.leading and record.holder != p.name:
                    p.close(now)
            else:
                p.sighting = None
            wall = WALL + timedelta(seconds=now)  # renewTime moves with each renewal
            m = next_move(p.sighting, p.name, "ns", "lease", timing, now, wall)
            if isinstance(m, Write):
                # The request lands `latency` later: meanwhile others may have written (the
                # simulation applies it at once but opens the fence only as of `started`).
                stored = server.write(m.body, m.create)
                if stored is not None:
                    p.sighting = sight(None, record_of(stored, timing.lease_seconds), now)
                    p.fence_until = started + timing.renew_deadline_seconds
                    if p.opened_at is None and now + latency < p.fence_until:
                        p.opened_at = now + latency  # the response arrives
                        p.leading = True
            p.wake = now + timing.retry_seconds
    for p in procs:
        p.close(seconds)
    reigns = sorted((a, b, p.name) for p in procs for a, b in p.reigns if b > a)
    overlaps = []
    for (a1, b1, n1), (a2, _, n2) in itertools.combinations(reigns, 2):
        if n1 != n2 and a1 <= a2 < b1:
            overlaps.append(f"{n1} wrote until {b1:.2f} while {n2} led from {a2:.2f}")
    return Run(reigns, overlaps)


@pytest.mark.parametrize("seed", range(40))
def test_no_two_fences_are_ever_open_at_once(seed: int) -> None:
    assert simulate(TIMING, seed).overlaps == []


def test_the_simulation_sees_leadership_move() -> None:
    # Not vacuous: the pauses take leadership from one candidate to another many times.
    moves = 0
    for seed in range(10):
        holders = [name for _, _, name in simulate(TIMING, seed).reigns]
        moves += sum(1 for x, y in itertools.pairwise(holders) if x != y)
    assert moves >= 20


def test_a_renew_deadline_past_the_lease_lets_two_write_at_once() -> None:
    # The red proof: the same simulation with the deadline the Timing check refuses finds
    # overlapping reigns, so the green runs above are the timing's doing, not the simulation's.
    unsafe = dataclasses.replace(TIMING)
    object.__setattr__(unsafe, "renew_deadline_seconds", 40.0)
    assert any(simulate(unsafe, seed).overlaps for seed in range(40))


def test_record_of_reads_a_lease_without_a_spec() -> None:
    assert record_of({"metadata": {"resourceVersion": "1"}}, 15.0) == LeaseRecord(
        "", 15.0, "", "", 0, "1"
    )
