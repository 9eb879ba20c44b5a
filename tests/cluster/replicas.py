"""Operators run as replicas that elect a leader (`pdmtp run --leader-elect`), and the API
server's audit log, which tells their writes apart by User-Agent (`pdmtp/<version> (<id>)`)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cluster.kubehelpers import wait_for
from operator_harness import OperatorProcess

LEASE_SECONDS = 4.0
RENEW_DEADLINE_SECONDS = 2.5
RETRY_SECONDS = 0.5
"""Short, so a failover costs the tests seconds; the same ratios as the defaults (15/10/2)."""


def elected(
    kubeconfig: Path, namespace: str, log_dir: Path, identity: str, webhook: bool = False
) -> OperatorProcess:
    """An operator for `namespace` that elects on a Lease there, known as `identity` (and
    serves the webhook on 127.0.0.1 when it leads, with `webhook`)."""
    return OperatorProcess(
        kubeconfig,
        [namespace],
        log_dir / f"operator-{identity}.log",
        webhook=webhook,
        extra_args=[
            "--leader-elect",
            f"--leader-election-namespace={namespace}",
            f"--leader-election-identity={identity}",
            f"--lease-seconds={LEASE_SECONDS}",
            f"--renew-deadline-seconds={RENEW_DEADLINE_SECONDS}",
            f"--retry-seconds={RETRY_SECONDS}",
        ],
    )


def leader_state(op: OperatorProcess) -> dict[str, object]:
    """`/readyz`'s leader block ({} when the process is not up)."""
    if op.proc is None or op.proc.poll() is not None:
        return {}
    try:
        _, body = op.health()
    except OSError:
        return {}
    leader = body.get("leader")
    return leader if isinstance(leader, dict) else {}


def leading(op: OperatorProcess) -> bool:
    return leader_state(op).get("leading") is True


def wait_leader(ops: Sequence[OperatorProcess], timeout: float = 30) -> OperatorProcess:
    """The one replica that leads, once exactly one does."""
    found: list[OperatorProcess] = []

    def one() -> bool:
        found[:] = [op for op in ops if leading(op)]
        return len(found) == 1

    wait_for(one, "exactly one leader", timeout, interval=0.1)
    return found[0]


@dataclass(frozen=True)
class AuditedWrite:
    agent: str
    verb: str
    resource: str
    name: str
    code: int
    received: datetime

    @property
    def landed(self) -> bool:
        return self.code < 300

    def line(self) -> str:
        return f"{self.received:%H:%M:%S.%f} {self.agent}: {self.verb} {self.resource}/{self.name}"


def _at(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def audited_writes(audit_log: Path, namespace: str, agent: str) -> list[AuditedWrite]:
    """The writes in `namespace` whose User-Agent names `agent`, in the order received."""
    out = []
    if not audit_log.exists():
        raise AssertionError(f"no audit log at {audit_log}: the control plane predates it")
    for line in audit_log.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:  # the line the API server is writing now
            continue
        ref = event.get("objectRef") or {}
        if ref.get("namespace") != namespace or agent not in (event.get("userAgent") or ""):
            continue
        resource = ref.get("resource", "") + (
            f"/{ref['subresource']}" if ref.get("subresource") else ""
        )
        out.append(
            AuditedWrite(
                agent=event["userAgent"],
                verb=event["verb"],
                resource=resource,
                name=ref.get("name", ""),
                code=int((event.get("responseStatus") or {}).get("code") or 0),
                received=_at(event["requestReceivedTimestamp"]),
            )
        )
    return sorted(out, key=lambda w: w.received)


def wait_exit(op: OperatorProcess, timeout: float) -> int:
    assert op.proc is not None
    deadline = time.monotonic() + timeout
    while op.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    code = op.proc.poll()
    assert code is not None, f"still running after {timeout}s:\n{op.log_tail(30)}"
    return code
