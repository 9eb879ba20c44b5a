"""kind e2e: the engines' NetworkPolicy, enforced (kube-network-policies on the node, see
hack/kind/network-policies.yaml) and right. Real router, emulated engines, probes from pods:

1. who reaches which engine port, each a TCP connect from a pod inside the node: an outsider in
   the same namespace reaches none (HTTP, bootstrap, transfer, metrics); the routers reach HTTP
   and bootstrap only; each engine role reaches the other on every port; a pod labelled
   `pdmtp.io/metrics-scraper: "true"` (the operator's is, by deploy/), and any pod of a namespace
   labelled so, reaches the metrics-only port alone, where GET /metrics answers and nothing
   else does;
2. a paired rollout under the in-cluster load client: no request fails, and the new revision's
   engines are as closed to the outsider;
3. the control: with the operator scaled to 0 (it restores a deleted policy) and the policy
   deleted, the same outsider connects to every port it was refused, so the probe can fail;
   the operator, back, restores the policy and the outsider is refused again.

A refused connection here is a dropped SYN: the probe waits CONNECT_SECONDS for it. Every probe
is a bounded list of attempts made by `kubectl exec` in a pod of this test's namespaces; the test
process itself dials nothing but the API server on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from builders import pdd
from e2e.conftest import new_namespace
from e2e.kindkit import OPERATOR_NAMESPACE, Kind, LoadRun, wait_for
from pdmtp.api.vocabulary import (
    ENGINE_HTTP_PORT,
    ENGINE_METRICS_PORT,
    LABEL_METRICS_SCRAPER,
    LABEL_NAME,
    LABEL_REVISION,
    LABEL_ROLE,
    METRICS_SCRAPER_VALUE,
)

NAME = "fenced"
POLICY = f"{NAME}-pd"
BOOTSTRAP_PORT = 8998
TRANSFER_PORT = 17000  # pdmtp_emulator.serve.WORKER_PORT: the prefill's KV transfer worker
CONNECT_SECONDS = 3.0
"""One connect attempt's bound: a dropped SYN is retried by the kernel at 1 s, so a policy that
lets it through shows well within this."""
ALLOWED_TRIES = 3
"""Attempts for a connection the policy allows (a pod's IP reaches the enforcer's cache a moment
after the pod starts); a refused one gets exactly one attempt."""
RESULT_ENV = "PDMTP_E2E_NETPOL_RESULT"

PROBE = """
import json, socket, sys, urllib.error, urllib.request
timeout, tries = float(sys.argv[1]), int(sys.argv[2])
out = {}
for label, host, port, path in json.loads(sys.argv[3]):
    result = "timeout"
    for _ in range(tries):
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result = "connected"
        except socket.timeout:
            result = "timeout"
        except OSError as error:
            result = "error: " + (error.strerror or str(error))
        if result == "connected" and path:
            try:
                with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout) as r:
                    result = f"http {r.status} " + r.read(4096).decode(errors="replace")
            except urllib.error.HTTPError as error:
                result = f"http {error.code}"
            except OSError as error:
                result = "http error: " + str(error)
        if result.startswith(("connected", "http")):
            break
    out[label] = result
print(json.dumps(out))
"""

state: dict[str, Any] = {}
results: dict[str, Any] = {}


def spec_for(kind: Kind) -> dict[str, Any]:
    return (
        pdd(NAME)
        .set(image=kind.images.emulator, model={"name": kind.images.engine_model})
        .mtp(3, modules=3, method="deepseek_mtp")
        .router(image=kind.images.router, resources={"requests": {"cpu": "100m"}})
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=3)
        # Emulated engines stop at once: 3 s of serving after they are told to stop.
        .set(pod={"terminationGracePeriodSeconds": 33})
        .unjudged()  # the policies are the question, not the verdict's hold
        .dict()
    )


def idle_pod(kind: Kind, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod that only waits, in the emulator image (it has Python for the probe)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": name, **labels}},
        "spec": {
            "restartPolicy": "Never",
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "idle",
                    "image": kind.images.emulator,
                    "command": ["python", "-c", "import time; time.sleep(3600)"],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def ready_pod(kind: Kind, namespace: str, name: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pod: dict[str, Any] = kind.get("pod", "-n", namespace, name)
        conds = pod["status"].get("conditions", [])
        up = any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
        return pod if up and pod["status"].get("podIP") else None

    return wait_for(ready, f"pod {namespace}/{name} ready", 120)


def probe(
    kind: Kind, namespace: str, pod: str, targets: list[tuple[str, str, int, str]], tries: int
) -> dict[str, str]:
    """Connect from `pod` to each (label, ip, port, http path or ''): at most `tries` attempts
    of CONNECT_SECONDS each (and one GET of the path once connected)."""
    out = kind.kubectl(
        "-n",
        namespace,
        "exec",
        pod,
        "--",
        "python",
        "-c",
        PROBE,
        str(CONNECT_SECONDS),
        str(tries),
        json.dumps(targets),
        timeout=60 + len(targets) * tries * 2 * CONNECT_SECONDS,
    )
    found: dict[str, str] = json.loads(out.strip().splitlines()[-1])
    return found


def engine_ip(kind: Kind, namespace: str, revision: str, role: str) -> str:
    (pod,) = kind.pods(
        namespace, f"{LABEL_NAME}={NAME},{LABEL_REVISION}={revision},{LABEL_ROLE}={role}"
    )
    ip: str = pod["status"]["podIP"]
    return ip


def first_pod(kind: Kind, namespace: str, revision: str, role: str) -> str:
    pods = kind.pods(
        namespace, f"{LABEL_NAME}={NAME},{LABEL_REVISION}={revision},{LABEL_ROLE}={role}"
    )
    ready = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    name: str = ready[0]["metadata"]["name"]
    return name


def operator_pod(kind: Kind) -> str:
    """Either replica: both carry the scraper label (the leader is the one that scrapes)."""
    return kind.operator_leader()


def every_port(prefill: str, decode: str) -> list[tuple[str, str, int, str]]:
    return [
        ("prefill http", prefill, ENGINE_HTTP_PORT, ""),
        ("prefill bootstrap", prefill, BOOTSTRAP_PORT, ""),
        ("prefill transfer", prefill, TRANSFER_PORT, ""),
        ("prefill metrics", prefill, ENGINE_METRICS_PORT, ""),
        ("decode http", decode, ENGINE_HTTP_PORT, ""),
        ("decode metrics", decode, ENGINE_METRICS_PORT, ""),
    ]


def record(key: str, figures: Any) -> None:
    results[key] = figures
    print(f"\n{key}: {json.dumps(figures, sort_keys=True)}")
    if os.environ.get(RESULT_ENV):
        Path(os.environ[RESULT_ENV]).write_text(json.dumps(results, indent=2, sort_keys=True))


def settled(kind: Kind, namespace: str) -> str | None:
    """The current revision once the PDDeployment is Available, not progressing, and runs
    exactly one prefill and one decode (no old pod left)."""
    status = kind.pdd(namespace, NAME).get("status", {})
    conds = {c["type"]: c["status"] for c in status.get("conditions", [])}
    if conds.get("Available") != "True" or conds.get("Progressing") != "False":
        return None
    for role in ("prefill", "decode"):
        pods = kind.pods(namespace, f"{LABEL_NAME}={NAME},{LABEL_ROLE}={role}")
        if len(pods) != 1 or pods[0]["metadata"].get("deletionTimestamp"):
            return None
    revision: str | None = status.get("currentRevision")
    return revision


@pytest.fixture(scope="module")
def scraper_namespace(kind: Kind) -> Iterator[str]:
    """A namespace labelled as a metrics scraper (as a Prometheus's would be), with one
    unlabelled pod in it."""
    name = new_namespace(kind, "netpol-monitoring")
    kind.kubectl("label", "namespace", name, f"{LABEL_METRICS_SCRAPER}={METRICS_SCRAPER_VALUE}")
    yield name
    kind.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_1_only_its_engines_routers_and_scrapers_reach_the_engine_ports(
    kind: Kind, namespace: str, scraper_namespace: str
) -> None:
    kind.apply(spec_for(kind), namespace)
    scraper = {LABEL_METRICS_SCRAPER: METRICS_SCRAPER_VALUE}
    kind.apply(idle_pod(kind, "outsider", {}), namespace)
    kind.apply(idle_pod(kind, "scraper", scraper), namespace)
    kind.apply(idle_pod(kind, "monitor", {}), scraper_namespace)
    revision = wait_for(lambda: settled(kind, namespace), f"{NAME} Available", 240)
    for name, ns in (
        ("outsider", namespace),
        ("scraper", namespace),
        ("monitor", scraper_namespace),
    ):
        ready_pod(kind, ns, name)
    kind.get("networkpolicy", "-n", namespace, POLICY)
    prefill = engine_ip(kind, namespace, revision, "prefill")
    decode = engine_ip(kind, namespace, revision, "decode")
    router = first_pod(kind, namespace, revision, "router")
    ports = every_port(prefill, decode)
    metrics_get = [
        ("prefill GET /metrics", prefill, ENGINE_METRICS_PORT, "/metrics"),
        ("decode GET /metrics", decode, ENGINE_METRICS_PORT, "/metrics"),
        ("prefill GET /health on metrics", prefill, ENGINE_METRICS_PORT, "/health"),
    ]
    closed = [t for t in ports if "metrics" not in t[0]]
    opened = {
        # source: (pod, namespace, targets it must reach, targets it must not)
        "outsider": ("outsider", namespace, [], ports),
        "router": (
            router,
            namespace,
            [t for t in ports if t[0] in ("prefill http", "prefill bootstrap", "decode http")],
            [t for t in ports if t[0] in ("prefill transfer", "prefill metrics", "decode metrics")],
        ),
        "decode": (
            first_pod(kind, namespace, revision, "decode"),
            namespace,
            [t for t in ports if t[0].startswith("prefill")],
            [],
        ),
        "prefill": (
            first_pod(kind, namespace, revision, "prefill"),
            namespace,
            [t for t in ports if t[0].startswith("decode")],
            [],
        ),
        "scraper pod": ("scraper", namespace, metrics_get, closed),
        "scraper namespace": ("monitor", scraper_namespace, metrics_get, closed),
        # deploy/operator/operator.yaml labels the operator's pod as a scraper.
        "operator": (operator_pod(kind), OPERATOR_NAMESPACE, metrics_get[:1], closed[:2]),
    }
    table: dict[str, dict[str, str]] = {}
    for source, (pod, ns, allowed, refused) in opened.items():
        seen = probe(kind, ns, pod, allowed, ALLOWED_TRIES) if allowed else {}
        if refused:
            seen |= probe(kind, ns, pod, refused, 1)
        table[source] = {label: result.split("\n")[0][:60] for label, result in seen.items()}
        for label, *_ in allowed:
            want = (
                "http 404"
                if "/health" in label
                else "connected"
                if "GET" not in label
                else "http 200"
            )
            assert seen[label].startswith(want), f"{source} -> {label}: {seen[label]}"
            if want == "http 200":
                assert "vllm:num_requests_running" in seen[label], seen[label]
        for label, *_ in refused:
            assert seen[label] == "timeout", f"{source} -> {label} must be refused: {seen[label]}"
    record("with the policy", table)
    state.update(revision=revision, prefill=prefill, decode=decode)


def test_2_requests_flow_through_a_paired_rollout_under_the_policy(
    kind: Kind, namespace: str
) -> None:
    old = state["revision"]
    run = LoadRun.start(kind, namespace, NAME, max_requests=20_000, max_seconds=300)
    run.wait_sending()
    started = time.monotonic()
    kind.kubectl(
        "-n",
        namespace,
        "patch",
        "pddeployment",
        NAME,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"speculative": {"numSpeculativeTokens": 2}}}),
    )

    def rolled() -> str | None:
        revision = settled(kind, namespace)
        return revision if revision and revision != old else None

    new = wait_for(rolled, "the paired rollout", 300)
    roll_seconds = round(time.monotonic() - started, 1)
    run.wait_answers()  # on the new revision alone
    run.stop()
    summary = run.summary()
    prefill = engine_ip(kind, namespace, new, "prefill")
    decode = engine_ip(kind, namespace, new, "decode")
    outsider = probe(kind, namespace, "outsider", every_port(prefill, decode), 1)
    record(
        "paired rollout under the policy",
        {
            "roll_seconds": roll_seconds,
            "requests_sent": summary["sent"],
            "requests_failed": summary["failed"],
            "cross_revision": summary["cross_revision"],
            "pairs": summary["pairs"],
            "errors": summary["errors"],
            "outsider_to_new_revision": outsider,
        },
    )
    assert summary["failed"] == 0, summary["errors"]
    assert summary["cross_revision"] == 0, summary["pairs"]
    assert summary["ok"] > 0
    assert set(outsider.values()) == {"timeout"}, outsider
    state.update(revision=new, prefill=prefill, decode=decode)


def _operator_replicas(kind: Kind, replicas: int) -> None:
    kind.kubectl(
        "-n", OPERATOR_NAMESPACE, "scale", "deployment", "pdmtp-operator", f"--replicas={replicas}"
    )
    if replicas:
        kind.kubectl(
            "-n",
            OPERATOR_NAMESPACE,
            "rollout",
            "status",
            "deployment/pdmtp-operator",
            "--timeout=180s",
            timeout=210,
        )
    else:
        wait_for(
            lambda: not kind.pods(OPERATOR_NAMESPACE, "app.kubernetes.io/name=pdmtp-operator"),
            "the operator gone",
            120,
        )


def test_3_control_without_the_policy_the_outsider_connects(kind: Kind, namespace: str) -> None:
    targets = every_port(state["prefill"], state["decode"])
    # The operator restores a deleted policy at once: stop it for the control.
    _operator_replicas(kind, 0)
    try:
        kind.kubectl("-n", namespace, "delete", "networkpolicy", POLICY, "--wait=true")
        without = probe(kind, namespace, "outsider", targets, ALLOWED_TRIES)
    finally:
        _operator_replicas(kind, 2)  # as deploy/ installs it: a leader and a standby
    wait_for(
        lambda: kind.get("networkpolicy", "-n", namespace, POLICY),
        "the operator to restore the policy",
        120,
    )
    # The enforcer sees the restored policy through its watch: refused again, within a bound.
    restored: dict[str, str] = {}

    def refused_again() -> bool:
        restored.update(probe(kind, namespace, "outsider", targets, 1))
        return set(restored.values()) == {"timeout"}

    wait_for(refused_again, "the outsider refused again", 60, every=2)
    record("control: policy deleted, operator stopped", {"outsider": without})
    record("policy restored by the operator", {"outsider": restored})
    assert set(without.values()) == {"connected"}, without
