"""What the kind e2e drives: the cluster hack/kind-e2e.sh made, through kubectl and the API.

Network rule: the test process talks only to the kind API server on 127.0.0.1. Everything that
reaches a pod goes through the API server (`kubectl exec`, the pod and service proxies) or runs
in a pod of its own (the load client), so all traffic stays on loopback or inside the kind nodes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cluster import kubehelpers
from pdmtp.api.vocabulary import ANNOTATION_LEAVING

T = TypeVar("T")

IMAGE_ENV = {
    "emulator": "PDMTP_E2E_EMULATOR_IMAGE",
    "router": "PDMTP_E2E_ROUTER_IMAGE",
    "operator": "PDMTP_E2E_OPERATOR_IMAGE",
}
ENGINE_MODEL_ENV = "PDMTP_E2E_ENGINE_MODEL"
"""The model the emulated engines are given (they load nothing)."""
OPERATOR_NAMESPACE = "pdmtp-system"
ANSWERS_AFTER = 100
"""Requests a load client must answer after an event (a rollout done, serving again) before it
is stopped: ~2 s of the 4-client load, so the summary covers the settled state."""


@dataclass(frozen=True)
class Images:
    emulator: str
    router: str
    operator: str
    engine_model: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Images:
        required = [*IMAGE_ENV.values(), ENGINE_MODEL_ENV]
        missing = [name for name in required if not env.get(name)]
        if missing:
            raise LookupError(f"unset: {', '.join(missing)} (hack/kind-e2e.sh sets them)")
        images = {key: env[name] for key, name in IMAGE_ENV.items()}
        return cls(**images, engine_model=env[ENGINE_MODEL_ENV])


class KubectlError(RuntimeError):
    pass


def wait_for(probe: Callable[[], T | None], what: str, timeout: float, every: float = 1.0) -> T:
    """Poll until `probe` returns something truthy; kubectl failures and missing fields mean
    "not yet"."""
    return kubehelpers.wait_for(
        probe, what, timeout, interval=every, transient=(KubectlError, LookupError, ValueError)
    )


@dataclass
class Kind:
    kubeconfig: Path
    kubectl_bin: str
    images: Images

    def kubectl(
        self, *args: str, stdin: str | None = None, timeout: float = 120, check: bool = True
    ) -> str:
        cmd = [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def raw(self, path: str) -> str:
        """GET through the API server (pod and service proxies reach into the node from there)."""
        return self.kubectl("get", "--raw", path)

    def apply(self, obj: Mapping[str, Any], namespace: str | None = None) -> None:
        ns = ["-n", namespace] if namespace else []
        self.kubectl("apply", *ns, "--server-side", "-f", "-", stdin=json.dumps(obj))

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get("pods", "-n", namespace, "-l", selector)["items"]
        return items

    def operator_leader(self) -> str:
        """The operator pod that holds the leader Lease (its identity is the pod's name and a
        suffix, `pdmtp.election.default_identity`)."""
        lease = self.get("lease", "-n", OPERATOR_NAMESPACE, "pdmtp-operator")
        holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
        if not holder:
            raise KubectlError("the operator's Lease names no holder")
        return holder.rsplit("_", 1)[0]

    def operator_metrics(self) -> str:
        """The leading operator's metrics (the Service would answer from either replica, and
        the standby reconciles nothing), through the API server's pod proxy."""
        pod = self.operator_leader()
        return self.raw(f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/pods/{pod}:9090/proxy/metrics")

    def pdd(self, namespace: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.get("pddeployment", "-n", namespace, name)
        return obj

    def condition(self, namespace: str, name: str, kind: str) -> dict[str, Any] | None:
        conds = self.pdd(namespace, name).get("status", {}).get("conditions", [])
        return next((c for c in conds if c["type"] == kind), None)

    def settled(self, namespace: str, name: str) -> bool:
        """The PDDeployment Available and not progressing."""
        available = self.condition(namespace, name, "Available") or {}
        progressing = self.condition(namespace, name, "Progressing") or {}
        return available.get("status") == "True" and progressing.get("status") == "False"

    def wait_condition(self, namespace: str, name: str, condition: str, timeout: int) -> None:
        """`kubectl wait --for=condition=...`, as a user would."""
        self.kubectl(
            "wait",
            "-n",
            namespace,
            f"--for=condition={condition}",
            f"pddeployment/{name}",
            f"--timeout={timeout}s",
            timeout=timeout + 30,
        )

    def pod_json(
        self, namespace: str, pod: str, port: int, path: str, body: Any | None = None
    ) -> Any:
        """GET (POST `body` as JSON, if given) an engine pod's own HTTP endpoint from inside it
        (`kubectl exec`, loopback). Not through the API server's pod proxy: that dials from the
        control-plane node, which the engines' NetworkPolicy rightly refuses once the pod runs on
        another node."""
        url = f"http://127.0.0.1:{port}/{path.lstrip('/')}"
        data = None if body is None else json.dumps(body).encode()
        fetch = (
            "import sys, urllib.request; "
            f"r = urllib.request.Request({url!r}, data={data!r}, "
            "headers={'Content-Type': 'application/json'}); "
            "sys.stdout.write(urllib.request.urlopen(r, timeout=10).read().decode())"
        )
        return json.loads(
            self.kubectl("-n", namespace, "exec", pod, "-c", "engine", "--", "python", "-c", fetch)
        )

    def diagnostics(self, namespace: str | None) -> str:
        """What a red run should print: the operator's log, the namespace's objects and events."""
        parts = []
        commands: list[Sequence[str]] = [
            # Every replica's: the leader's reconciles, the standby's waiting.
            ("-n", OPERATOR_NAMESPACE, "logs", "-l", OPERATOR_SELECTOR, "--prefix", "--tail=80"),
            ("get", "nodes", "-o", "wide"),
        ]
        if namespace:
            commands += [
                ("-n", namespace, "get", "pddeployments", "-o", "yaml"),
                ("-n", namespace, "get", "deploy,rs,pods,svc", "-o", "wide"),
                ("-n", namespace, "get", "events", "--sort-by=.lastTimestamp"),
            ]
        for args in commands:
            out = self.kubectl(*args, check=False, timeout=30)
            # The operator logs every probe; those lines explain nothing.
            out = "\n".join(line for line in out.splitlines() if "kube-probe/" not in line)
            parts.append(f"$ kubectl {' '.join(args)}\n{out}")
        return "\n".join(parts)


def serving(pod: Mapping[str, Any]) -> bool:
    """An engine pod that serves and stays: Ready, neither terminating nor marked leaving."""
    meta = pod["metadata"]
    if meta.get("deletionTimestamp") or ANNOTATION_LEAVING in (meta.get("annotations") or {}):
        return False
    ready = [c for c in pod["status"].get("conditions", []) if c["type"] == "Ready"]
    return bool(ready) and ready[0]["status"] == "True"


def patch_pdd(kind: Kind, namespace: str, name: str, body: Mapping[str, Any]) -> None:
    """A merge patch of a PDDeployment, as `kubectl patch --type=merge` sends it."""
    kind.kubectl(
        "-n", namespace, "patch", "pddeployment", name, "--type=merge", "-p", json.dumps(body)
    )


@dataclass
class Figures:
    """A test module's measured figures: printed as each is recorded, and kept as JSON in the
    file the environment variable `env` names, when it is set."""

    env: str
    results: dict[str, Any] = field(default_factory=dict)

    def record(self, key: str, figures: dict[str, Any]) -> None:
        self.results[key] = figures
        print(f"\n{key}: {json.dumps(figures, sort_keys=True)}")
        if os.environ.get(self.env):
            Path(os.environ[self.env]).write_text(
                json.dumps(self.results, indent=2, sort_keys=True)
            )


def load_pod(
    name: str,
    image: str,
    url: str,
    *,
    concurrency: int,
    max_requests: int,
    max_seconds: float,
    request_classes: str = "",
) -> dict[str, Any]:
    """A pod running the emulator image's bounded load client against `url`; with
    `request_classes` (`code=1,chat=1`: weights) each request is of a class drawn by them."""
    command = [
        "python",
        "-m",
        "pdmtp_emulator",
        "load",
        f"--url={url}",
        f"--concurrency={concurrency}",
        f"--max-requests={max_requests}",
        f"--max-seconds={max_seconds}",
        "--stop-file=/tmp/stop",
    ]
    if request_classes:
        command.append(f"--request-classes={request_classes}")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "pdmtp-e2e-load"}},
        "spec": {
            "restartPolicy": "Never",
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "load",
                    "image": image,
                    "command": command,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


@dataclass
class LoadRun:
    """One load client pod: started, optionally stopped early, then its summary read."""

    kind: Kind
    namespace: str
    name: str

    @classmethod
    def start(
        cls,
        kind: Kind,
        namespace: str,
        service: str,
        *,
        concurrency: int = 4,
        max_requests: int,
        max_seconds: float,
        request_classes: str = "",
    ) -> LoadRun:
        name = f"load-{uuid.uuid4().hex[:6]}"
        url = f"http://{service}.{namespace}.svc.cluster.local/v1/completions"
        pod = load_pod(
            name,
            kind.images.emulator,
            url,
            concurrency=concurrency,
            max_requests=max_requests,
            max_seconds=max_seconds,
            request_classes=request_classes,
        )
        kind.apply(pod, namespace)
        return cls(kind, namespace, name)

    def progress(self) -> dict[str, Any] | None:
        lines = self.kind.kubectl("-n", self.namespace, "logs", self.name, check=False).splitlines()
        found = [json.loads(line) for line in lines if line.startswith("{")]
        return found[-1] if found else None

    def wait_sending(self, timeout: float = 120) -> None:
        wait_for(lambda: (self.progress() or {}).get("ok", 0) > 0, f"{self.name} answered", timeout)

    def answered(self) -> tuple[float, int]:
        """(seconds into the run, requests answered so far) from the newest progress line."""
        last = self.progress() or {}
        return float(last.get("seconds", -1.0)), int(last.get("ok", 0)) + int(last.get("failed", 0))

    def wait_answers(self, count: int = ANSWERS_AFTER, timeout: float = 90) -> None:
        """Until `count` more requests have been answered, counted from the first progress line
        printed after this call (lines come every 2 s): a stretch of traffic after an event,
        measured in requests rather than seconds. Fails if the client stops first."""
        called_at, _ = self.answered()
        deadline = time.monotonic() + timeout

        def fresh() -> tuple[int] | None:
            seconds, answers = self.answered()
            return (answers,) if seconds > called_at else None

        (baseline,) = wait_for(fresh, f"{self.name}: a progress line", timeout)
        wait_for(
            lambda: self.answered()[1] >= baseline + count,
            f"{self.name}: {count} more answers",
            max(deadline - time.monotonic(), 1.0),
        )

    def stop(self) -> None:
        self.kind.kubectl("-n", self.namespace, "exec", self.name, "--", "touch", "/tmp/stop")

    def summary(self, timeout: float = 120) -> dict[str, Any]:
        def finished() -> str | None:
            pod = self.kind.get("pod", "-n", self.namespace, self.name)
            phase: str = pod["status"].get("phase", "")
            return phase if phase in ("Succeeded", "Failed") else None

        phase = wait_for(finished, f"{self.name} to finish", timeout)
        last = self.progress()
        if phase != "Succeeded" or not last or not last.get("summary"):
            raise AssertionError(f"load client {self.name} ended {phase}: {last}")
        return last


# ---- upgrades and uninstalls (tests/e2e/test_upgrade.py) -----------------------------------------

UPGRADE_ENV = {
    "release": "PDMTP_E2E_PREVIOUS_RELEASE",
    "tree": "PDMTP_E2E_PREVIOUS_TREE",
    "image": "PDMTP_E2E_PREVIOUS_OPERATOR_IMAGE",
    "helm": "PDMTP_HELM",
    "overlay": "PDMTP_E2E_INSTALL_OVERLAY",
}
OPERATOR_SELECTOR = "app.kubernetes.io/name=pdmtp-operator"
_RECONCILES = re.compile(r"^pdmtp_reconcile_total\{([^}]*)\}\s+([0-9.e+]+)$", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Upgrade:
    """What an upgrade starts from (the previous release: its tree with deploy/ and charts/, and
    its operator image) and what it goes to (this tree, the overlay install_pdmtp applies)."""

    release: str
    tree: Path
    image: str
    helm: str
    overlay: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Upgrade:
        missing = [name for name in UPGRADE_ENV.values() if not env.get(name)]
        if missing:
            raise LookupError(f"unset: {', '.join(missing)} (hack/kind-e2e.sh sets them)")
        got = {key: env[name] for key, name in UPGRADE_ENV.items()}
        up = cls(
            release=got["release"],
            tree=Path(got["tree"]),
            image=got["image"],
            helm=got["helm"],
            overlay=Path(got["overlay"]),
        )
        for path in (up.tree / "deploy/kustomization.yaml", up.overlay / "kustomization.yaml"):
            if not path.is_file():
                raise LookupError(f"{path} is missing")
        if not os.access(up.helm, os.X_OK):
            raise LookupError(f"no helm at {up.helm} (hack/helm/build.sh builds it)")
        return up


def operator_pods(kind: Kind, image: str) -> list[str]:
    """The operator pods running `image`, Ready and not terminating."""
    found = []
    for pod in kind.pods(OPERATOR_NAMESPACE, OPERATOR_SELECTOR):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        statuses = pod["status"].get("containerStatuses") or []
        if (
            pod["spec"]["containers"][0]["image"] == image
            and statuses
            and all(s.get("ready") for s in statuses)
        ):
            found.append(str(pod["metadata"]["name"]))
    return found


def operator_pod(kind: Kind, image: str) -> str | None:
    """An operator pod running `image`, Ready and not terminating; None if there is none."""
    return next(iter(operator_pods(kind, image)), None)


def reconciles(kind: Kind, pod: str) -> dict[tuple[str, str], float]:
    """pdmtp_reconcile_total per (namespace, name), read from the operator pod's metrics port
    through the API server's pod proxy."""
    text = kind.raw(f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/pods/{pod}:9090/proxy/metrics")
    out: dict[tuple[str, str], float] = {}
    for labels, value in _RECONCILES.findall(text):
        got = dict(_LABEL.findall(labels))
        out[(got.get("namespace", ""), got.get("name", ""))] = float(value)
    return out


@dataclass
class Helm:
    """The helm CLI against the kind cluster, its caches and config in a directory of its own."""

    binary: str
    kubeconfig: Path
    home: Path

    def __call__(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        cmd = [self.binary, f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
        if check and result.returncode != 0:
            raise KubectlError(f"helm {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout
