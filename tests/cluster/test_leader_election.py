"""Two operator replicas on a real API server: one leads on a Lease, the other stands by; a leader
frozen past its lease (SIGSTOP) is replaced, and once resumed writes nothing (issue 31: operator
high availability). The API server's audit log names the writer of every write, so "nothing"
is read from the server, not from the operator's own account."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from builders import pdd
from cluster.kubehelpers import Cluster, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException
from operator_harness import (
    OperatorProcess,
    create_pdd,
    delete_webhook_configuration,
    patch_spec,
    ready_after,
    refused_at_admission,
    wait_settled,
)
from pdmtp.manager import LOST_LEASE_EXIT
from pdmtp.webhook import MANAGED_CONFIGURATION
from replicas import (
    LEASE_SECONDS,
    RETRY_SECONDS,
    audited_writes,
    elected,
    leader_state,
    leading,
    wait_exit,
    wait_leader,
)


@pytest.fixture
def pair(
    cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> Iterator[list[OperatorProcess]]:
    if cluster.local is None:
        pytest.skip("reads the API server's audit log: the local control plane only")
    ops = [elected(cluster.kubeconfig, namespace, tmp_path, name) for name in ("op-a", "op-b")]
    ops[0].start()
    wait_leader(ops[:1])  # a leads: b is the standby
    ops[1].start()
    yield ops
    for op in ops:
        if op.proc is not None and op.proc.poll() is None:
            os.kill(op.pid, signal.SIGCONT)  # a frozen one must be able to stop
        op.stop()
        print(f"---- {op.log_path.name} ----\n" + op.log_tail(60))


def lease(api: client.ApiClient, namespace: str) -> client.V1Lease:
    return client.CoordinationV1Api(api).read_namespaced_lease("pdmtp-operator", namespace)


def test_a_frozen_leader_is_replaced_and_writes_nothing_after_it_wakes(
    cluster: Cluster, namespace: str, pair: list[OperatorProcess]
) -> None:
    a, b = pair
    assert cluster.local is not None
    audit = cluster.local.audit_log
    spec = ready_after(pdd("ha").mtp(3, modules=3).prefill(replicas=1).decode(replicas=1), ms=300)
    create_pdd(cluster.api_client, namespace, spec.dict())
    wait_settled(cluster.api_client, namespace, "ha")
    assert leading(a) and not leading(b)
    assert leader_state(b)["holder"] == "op-a"
    assert audited_writes(audit, namespace, "(op-a)"), "the leader's writes are audited"
    assert audited_writes(audit, namespace, "(op-b)") == [], "the standby wrote"

    os.kill(a.pid, signal.SIGSTOP)
    frozen = time.monotonic()
    frozen_at = datetime.now(UTC)
    wait_for(lambda: leading(b), "the standby leads", LEASE_SECONDS + 10, interval=0.05)
    takeover = time.monotonic() - frozen
    print(f"standby led {takeover:.2f}s after the leader froze (lease {LEASE_SECONDS}s)")
    # It waits out a whole lease from its last sight of a renewal, and no more than one more
    # look (plus the test's own polling).
    assert LEASE_SECONDS - 2.5 <= takeover <= LEASE_SECONDS + 2 * RETRY_SECONDS + 1.5
    assert lease(cluster.api_client, namespace).spec.holder_identity == "op-b"

    # Work only the new leader can do: a scale-up, which it must write.
    spec.decode(replicas=2)
    patch_spec(cluster.api_client, namespace, "ha", spec.dict()["spec"])
    wait_for(
        lambda: any(w.landed for w in audited_writes(audit, namespace, "(op-b)")),
        "the new leader's first write",
        30,
    )
    first_b = min(w.received for w in audited_writes(audit, namespace, "(op-b)") if w.landed)

    # The old leader wakes with its caches and workers as they were when it froze, a lease it
    # believes it holds, and a spec change to act on.
    os.kill(a.pid, signal.SIGCONT)
    assert wait_exit(a, 20) == LOST_LEASE_EXIT
    obj = wait_settled(cluster.api_client, namespace, "ha")
    decode = next(r for r in obj["status"]["roles"] if r["name"] == "decode")
    assert decode["readyReplicas"] == 2

    late = [w for w in audited_writes(audit, namespace, "(op-a)") if w.received >= frozen_at]
    landed_after_b = [w.line() for w in late if w.landed and w.received >= first_b]
    assert landed_after_b == [], "the old leader wrote after the new one"
    assert [w.line() for w in late if w.landed] == [], "a write of the frozen leader landed"
    print(
        f"old leader: {len(late)} writes sent after it froze (none landed); exit "
        f"{LOST_LEASE_EXIT}; fenced lines in its log: {a.log_tail(400).count('not sent')}"
    )
    assert leading(b)


def test_a_clean_stop_hands_the_lease_over_at_once(
    cluster: Cluster, namespace: str, pair: list[OperatorProcess]
) -> None:
    a, b = pair
    wait_for(lambda: leader_state(b).get("holder") == "op-a", "b sees a lead", 10)
    stopped = time.monotonic()
    a.stop()  # SIGTERM: kopf's clean-up, then the Lease is released
    assert a.proc is not None and a.proc.returncode == 0, a.log_tail(30)
    wait_for(lambda: leading(b), "the standby leads", LEASE_SECONDS + 5, interval=0.05)
    handover = time.monotonic() - stopped
    print(f"standby led {handover:.2f}s after SIGTERM to the leader")
    assert handover < LEASE_SECONDS, "released: no need to wait out the lease"
    assert lease(cluster.api_client, namespace).spec.lease_transitions == 1


def test_only_the_leader_serves_the_webhook_and_the_standby_takes_it_over(
    cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> None:
    if cluster.local is None:
        pytest.skip("a containerised API server cannot reach a webhook on the host's loopback")
    a, b = (elected(cluster.kubeconfig, namespace, tmp_path, n, webhook=True) for n in "ab")
    admission = client.AdmissionregistrationV1Api(cluster.api_client)

    def url() -> str:
        try:
            config = admission.read_validating_webhook_configuration(MANAGED_CONFIGURATION)
        except ApiException:
            return ""
        return str(config.webhooks[0].client_config.url) if config.webhooks else ""

    def refused() -> str | None:
        return refused_at_admission(cluster.api_client, namespace)

    try:
        a.start()
        wait_leader([a])
        b.start()
        wait_for(lambda: f":{a.webhook_port}/" in url(), "the leader's webhook registered", 30)
        # The standby is ready (it takes over from warm caches) but serves no review.
        ready = wait_for(lambda: (h := b.health())[0] == 200 and h[1], "the standby ready", 30)
        assert ready["leader"]["leading"] is False, ready
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", b.webhook_port), timeout=2).close()
        assert "MTPModulesUnknown" in wait_for(refused, "the leader to refuse", 30, interval=0.5)

        a.kill()  # no hand-back: the standby waits the lease out
        wait_for(lambda: leading(b), "b leads", LEASE_SECONDS + 10, interval=0.1)
        wait_for(lambda: f":{b.webhook_port}/" in url(), "the new leader's webhook", 30)
        body = wait_for(refused, "the new leader to refuse", 30, interval=0.5)
        assert "denied the request" in body and "MTPModulesUnknown" in body
    finally:
        for op in (a, b):
            op.stop()
            print(f"---- {op.log_path.name} ----\n" + op.log_tail(60))
        delete_webhook_configuration(cluster.api_client)
