"""`pdmtp plan`: the rollout from one spec to another, played on the simulated cluster and
printed step by step (the canary hold and the rollback path included)."""

from __future__ import annotations

import argparse
import random
from dataclasses import replace
from typing import Any

from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.api.vocabulary import ROLES
from pdmtp.cli.base import EXIT_INCOMPATIBLE, UnusableInput
from pdmtp.cli.inputs import load_one
from pdmtp.core.agreement import check
from pdmtp.core.revision import role_hash
from pdmtp.core.rollout.invariants import InvariantMonitor
from pdmtp.core.rollout.planner import Policy, Step, Target
from pdmtp.core.rollout.steering import target_and_policy
from pdmtp.tools import simulate
from pdmtp.tools.simulate import InvariantViolation, SimCluster, Trace


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="from_file", required=True, metavar="OLD.yaml")
    p.add_argument("--to", dest="to_file", required=True, metavar="NEW.yaml")
    p.add_argument("--seed", type=int, default=0, help="order in which pods become ready")
    p.add_argument(
        "--ready-chance",
        type=float,
        default=0.6,
        help="chance a starting pod turns ready each simulated second",
    )
    p.add_argument(
        "--fail-after",
        type=int,
        metavar="SECONDS",
        help="show the rollback path: the new revision fails after this many seconds",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    old, new = load_one(args.from_file), load_one(args.to_file)
    start, _ = target_and_policy(check(old.spec))
    target, policy = target_and_policy(check(new.spec))
    if start.revision is None:
        raise UnusableInput(f"{args.from_file}: incompatible, so it cannot be what is serving")
    if target.revision is None:
        print(f"{args.to_file} is incompatible: no rollout starts; {start.revision} keeps serving.")
        for f in check(new.spec).findings:
            print(f"  {f.reason}: {f.message}")
        return EXIT_INCOMPATIBLE
    if target.revision == start.revision:
        _print_in_place(old, new, start, target)
        return 0
    return _simulate(args, new, start, target, policy)


def _print_in_place(old: PDDeployment, new: PDDeployment, start: Target, target: Target) -> None:
    changed = [r for r in ROLES if role_hash(old.spec, r) != role_hash(new.spec, r)]
    print(f"Same compat revision {start.revision}: no paired rollout.")
    if changed:
        print(
            f"Role-local change: {', '.join(changed)} roll in place "
            "(the Deployment's own rolling update)."
        )
    if (start.prefill, start.decode) != (target.prefill, target.decode):
        print(
            f"Scaling: prefill {start.prefill}->{target.prefill}, "
            f"decode {start.decode}->{target.decode}."
        )


def _simulate(
    args: argparse.Namespace, new: PDDeployment, start: Target, target: Target, policy: Policy
) -> int:
    """Play the rollout on the simulated cluster: the canary hold, the rollback path."""
    assert start.revision is not None and target.revision is not None
    revisions = [start.revision, target.revision]
    failing = {target.revision} if args.fail_after is not None else set()
    sim = SimCluster.serving(start.revision, start, failing=failing)
    monitor = InvariantMonitor(policy)
    rng = random.Random(args.seed)
    trace = Trace()
    canary = new.spec.rollout.canary
    try:
        if canary is not None:
            held = replace(policy, canary_percent=canary.percent)
            simulate.simulate_rollout(
                sim,
                monitor,
                target,
                rng,
                policy=held,
                ready_chance=args.ready_chance,
                trace=trace,
                until=lambda step: step.outcome == "Held",
            )
            print(format_trace(trace, revisions))
            if trace.steps and trace.steps[-1][2].outcome == "Held":
                print(
                    f"Canary holds: {target.revision} serves {canary.percent}% of each role next "
                    f"to {start.revision}; `pdmtp rollout promote` continues:"
                )
            trace = Trace()
        if args.fail_after is not None:
            simulate.simulate_rollout(
                sim,
                monitor,
                target,
                rng,
                max_ticks=args.fail_after,
                ready_chance=args.ready_chance,
                trace=trace,
            )
            print(format_trace(trace, revisions))
            print(
                f"{target.revision} fails (its engines never get ready); rolling back "
                f"to {start.revision}:"
            )
            back = replace(start, prefill=target.prefill, decode=target.decode)
            trace = Trace()
            simulate.simulate_rollout(
                sim, monitor, back, rng, ready_chance=args.ready_chance, trace=trace
            )
        else:
            simulate.simulate_rollout(
                sim, monitor, target, rng, ready_chance=args.ready_chance, trace=trace
            )
    except InvariantViolation as e:
        print(format_trace(trace, revisions))
        print(f"INVARIANT VIOLATED: {e}")
        return 3
    print(format_trace(trace, revisions))
    status = "completed" if trace.complete else "did not complete"
    rollback = args.fail_after is not None
    what, source, dest = (
        ("Rollback", target, start) if rollback else ("Paired rollout", start, target)
    )
    print(
        f"{what} {source.revision} -> {dest.revision} {status} in "
        f"{len(trace.steps)} steps (maxSurge {policy.max_surge}, maxUnavailable "
        f"{policy.max_unavailable}, drainSeconds {policy.drain_seconds}); invariants 2-5 and 8 "
        "held at every step."
    )
    return 0 if trace.complete else 3


def _cell(obs: dict[str, Any], revision: str) -> str:
    s = obs.get(revision)
    if s is None:
        return "-"
    phase = "serving" if s.serving else ("draining" if s.draining else "idle")
    return (
        f"P {s.prefill.ready}/{s.prefill.pods} D {s.decode.ready}/{s.decode.pods} "
        f"R {s.router.ready} {phase}"
    )


def _action(step: Step, obs: dict[str, Any]) -> str:
    notes = []
    for p in step.revisions:
        before = obs.get(p.revision)
        if before is None:
            notes.append(f"create {p.revision}")
            continue
        if p.delete:
            notes.append(f"retire {p.revision}")
            continue
        if p.drain_until is not None and not before.draining:
            notes.append(f"unroute {p.revision}")
        for role, old, new in (
            ("P", before.prefill.replicas, p.prefill),
            ("D", before.decode.replicas, p.decode),
            ("R", before.router.replicas, p.router),
        ):
            if old != new:
                notes.append(f"{p.revision} {role} {old}->{new}")
    return ", ".join(notes) or "wait"


def format_trace(trace: Trace, revisions: list[str]) -> str:
    width = 34
    header = f"{'t':>5}  " + "".join(f"{r:<{width}}" for r in revisions) + "action"
    lines = [header, "-" * len(header)]
    previous = ""
    quiet_since: float | None = None
    for now, observed, step in trace.steps:
        obs = {s.revision: s for s in observed}
        cells = "".join(f"{_cell(obs, r):<{width}}" for r in revisions)
        action = "rollout complete" if step.complete else _action(step, obs)
        if action == "wait" and cells == previous:
            # Nothing moves (a drain, or pods starting): one line for the whole stretch.
            quiet_since = now if quiet_since is None else quiet_since
            continue
        if quiet_since is not None:
            lines.append(f"{'':>5}  ... unchanged from {quiet_since:.0f}s to {now - 1:.0f}s")
            quiet_since = None
        lines.append(f"{now:>4.0f}s  {cells}{action}")
        previous = cells
    return "\n".join(lines)
