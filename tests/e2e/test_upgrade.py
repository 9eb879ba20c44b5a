"""kind e2e: upgrading pdmtp from the previous release, and uninstalling it, leave the workloads
alone (issue 23). Two PDDeployments (MTP k=3 over 3 modules as samples/demo.yaml, k=1 as
samples/minimal.yaml; emulated engines behind the real router) serve the in-cluster load client
throughout. One scenario per install path, each a test of its own whose steps share the
PDDeployments and their load (an uninstall is checked against what the upgrade left):

kustomize
  1. whatever pdmtp install the cluster has removed; the previous release installed from its own
     deploy/ with its own image, the PDDeployments created under it and loaded.
  2. this tree's deploy/ applied through the overlay that only swaps the image (install_pdmtp's).
     No request fails; no engine pod restarts or is replaced; no Deployment, engine ReplicaSet or
     ControllerRevision appears or goes (the routers roll once where the new release renders
     other router args: since issue 31, their health checks); every PDDeployment keeps its spec,
     generation and revisions. Checked once the new operator has reconciled each PDDeployment
     twice (its pdmtp_reconcile_total, read through the API server's pod proxy): any write it
     would make follows a reconcile.
  3. `kubectl delete -k deploy/operator/` leaves them serving (the load answers more requests with
     no operator); `kubectl delete crd` is refused by the deletion guard.
  4. the purge (CRDs annotated pdmtp.io/allow-delete=true, then `kubectl delete -k deploy/`)
     removes the CRDs, the PDDeployments and their pods.
helm
  1. as kustomize's, from `helm install` of the previous tree's chart and image;
  2. `helm upgrade` with this tree's chart and image, checked as kustomize's step 2;
  3. `helm uninstall` (default values) leaves them serving and the CRDs in place;
  4. installed again it serves a new PDDeployment; the purge (`helm upgrade --reuse-values --set
     crds.keep=false`, `helm uninstall`) removes everything.

Each scenario starts by removing whatever install it finds and runs in a namespace of its own, so
either runs alone or in either order. The module's teardown leaves this tree installed as
hack/kind-e2e.sh's install_pdmtp does, which the later files expect.
Figures go to PDMTP_E2E_UPGRADE_RESULT (JSON) when set, and are printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from builders import pdd
from e2e.conftest import new_namespace
from e2e.kindkit import (
    OPERATOR_NAMESPACE,
    OPERATOR_SELECTOR,
    Helm,
    Kind,
    KubectlError,
    LoadRun,
    Upgrade,
    operator_pod,
    operator_pods,
    reconciles,
    wait_for,
)
from kind_overlay import write_overlay
from pdmtp.api.vocabulary import LABEL_NAME, LABEL_ROLE

REPO = Path(__file__).resolve().parents[2]
RESULT_ENV = "PDMTP_E2E_UPGRADE_RESULT"
RELEASE = "pdmtp"
"""The Helm release's name (in OPERATOR_NAMESPACE, as the chart asks)."""
NAMES = ("mtp3", "mtp1")
FRESH = "fresh"
"""Created under this tree's chart after its helm install, to reach Available there."""
CRDS = ("pddeployments.pdmtp.io", "pdrolescales.pdmtp.io")
ALLOW_DELETE = "pdmtp.io/allow-delete"
results: dict[str, Any] = {}


@dataclass
class Serving:
    """One path's PDDeployments under load, and what they were before the upgrade."""

    loads: dict[str, LoadRun]
    before: dict[str, Any]
    marks: dict[str, dict[str, int]] = field(default_factory=dict)
    """Requests sent/failed per load client at each step, from its progress lines."""

    def mark(self, step: str) -> None:
        self.marks[step] = {}
        for name, load in self.loads.items():
            last = load.progress() or {}
            self.marks[step][f"{name}_sent"] = int(last.get("sent", 0))
            self.marks[step][f"{name}_failed"] = int(last.get("failed", 0))


def record(key: str, figures: Any) -> None:
    results[key] = figures
    print(f"\n{key}: {json.dumps(figures, sort_keys=True)}")
    if os.environ.get(RESULT_ENV):
        Path(os.environ[RESULT_ENV]).write_text(json.dumps(results, indent=2, sort_keys=True))


def spec_for(kind: Kind, name: str) -> dict[str, Any]:
    base = pdd(name).set(image=kind.images.emulator, model={"name": kind.images.engine_model})
    if name == "mtp3":
        base = base.mtp(3, modules=3, method="deepseek_mtp")
    else:
        base = base.mtp(1, method="qwen3_next_mtp")
    return (
        base.prefill(replicas=1)
        .decode(replicas=1)
        .router(image=kind.images.router, resources={"requests": {"cpu": "100m"}})
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=3)
        .set(pod={"terminationGracePeriodSeconds": 33})
        .dict()
    )


# ---- installs ------------------------------------------------------------------------------------


def operator_rolled_out(kind: Kind) -> None:
    kind.kubectl(
        "-n",
        OPERATOR_NAMESPACE,
        "rollout",
        "status",
        "deploy/pdmtp-operator",
        "--timeout=180s",
        timeout=210,
    )


def crds_served(kind: Kind) -> None:
    """hack/wait-crds.sh, as the install steps use it: `kubectl wait --for=condition=Established`
    fails at once on a CRD whose status the API server has not written yet."""
    subprocess.run(
        [str(REPO / "hack" / "wait-crds.sh"), "--timeout", "60", *CRDS],
        env={**os.environ, "KUBECTL": kind.kubectl_bin, "KUBECONFIG": str(kind.kubeconfig)},
        check=True,
        timeout=90,
    )


def install_kustomize(kind: Kind, overlay: Path) -> None:
    """What hack/kind-e2e.sh's install_pdmtp does (deploy/kustomization.yaml's install)."""
    kind.kubectl("apply", "--server-side", "-k", str(overlay), timeout=180)
    crds_served(kind)
    operator_rolled_out(kind)


def image_values(image: str) -> list[str]:
    repository, _, tag = image.rpartition(":")
    return ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"]


def operator_gone(kind: Kind) -> bool:
    try:
        return not kind.pods(OPERATOR_NAMESPACE, OPERATOR_SELECTOR)
    except KubectlError:
        return True  # the namespace itself is gone


def crds_gone(kind: Kind) -> bool:
    found = kind.kubectl("get", "crd", *CRDS, "--ignore-not-found", "-o", "name")
    return not found.strip()


def remove_pdmtp(kind: Kind, helm: Helm, overlay: Path) -> None:
    """Whatever pdmtp install the cluster has (kustomize or Helm), gone with its CRDs: so a
    release installs on a clean cluster."""
    if helm("status", RELEASE, "-n", OPERATOR_NAMESPACE, check=False).strip():
        helm("uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, check=False)
    present = kind.kubectl("get", "crd", *CRDS, "--ignore-not-found", "-o", "name").split()
    if present:
        kind.kubectl("annotate", *present, f"{ALLOW_DELETE}=true", "--overwrite")
    kind.kubectl("delete", "-k", str(overlay), "--ignore-not-found", "--wait=true", timeout=300)
    kind.kubectl(
        "delete", "namespace", OPERATOR_NAMESPACE, "--ignore-not-found", "--wait=true", timeout=300
    )
    wait_for(lambda: crds_gone(kind), "the pdmtp CRDs gone", 180)


@pytest.fixture(scope="module")
def helm(kind: Kind, upgrade: Upgrade, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(upgrade.helm, kind.kubeconfig, tmp_path_factory.mktemp("helm"))


@pytest.fixture(scope="module")
def overlays(
    upgrade: Upgrade, kind: Kind, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("overlays")
    return {
        "previous": write_overlay(
            root / "previous", upgrade.tree / "deploy", upgrade.image, args=()
        ),
        "current": upgrade.overlay,
        "current-operator": write_overlay(
            root / "current-operator", REPO / "deploy/operator", kind.images.operator
        ),
    }


@pytest.fixture
def namespace(kind: Kind, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace per scenario: neither sees what the other left (it overrides the module-wide
    one of tests/e2e/conftest.py)."""
    name = new_namespace(kind, request.node.name.removeprefix("test_"))
    yield name
    kind.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module", autouse=True)
def back_to_current(kind: Kind, upgrade: Upgrade, helm: Helm) -> Iterator[None]:
    """The later files run against this tree installed by kustomize, as install_pdmtp leaves it:
    put back after the scenarios, whichever ran and however they ended."""
    started = time.monotonic()
    yield
    reinstall = time.monotonic()
    remove_pdmtp(kind, helm, upgrade.overlay)
    install_kustomize(kind, upgrade.overlay)
    assert operator_pod(kind, kind.images.operator), "this tree's operator is not back"
    record("reinstall", {"seconds": round(time.monotonic() - reinstall, 1)})
    record("wall_seconds", round(time.monotonic() - started, 1))


# ---- what must not change ------------------------------------------------------------------------


def snapshot(kind: Kind, namespace: str) -> dict[str, Any]:
    """Identity of every workload object of the namespace's PDDeployments: pods (UID, restart
    counts), Deployments, ReplicaSets, ControllerRevisions, and the PDDeployments' spec,
    generation and revisions."""

    def items(resource: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = kind.get(resource, "-n", namespace, "-l", LABEL_NAME)["items"]
        return found

    def router(o: dict[str, Any]) -> bool:
        return bool(o["metadata"].get("labels", {}).get(LABEL_ROLE) == "router")

    def identities(found: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            p["metadata"]["name"]: {
                "uid": p["metadata"]["uid"],
                "restarts": {
                    c["name"]: c.get("restartCount", 0)
                    for c in (p.get("status") or {}).get("containerStatuses") or []
                },
            }
            for p in found
        }

    all_pods = items("pods")
    replicasets = items("replicasets")
    pods = identities([p for p in all_pods if not router(p)])
    owned = {
        "deployments": {o["metadata"]["name"]: o["metadata"]["uid"] for o in items("deployments")},
        "replicasets": {
            o["metadata"]["name"]: o["metadata"]["uid"] for o in replicasets if not router(o)
        },
    }
    # The routers may roll once on an upgrade whose router args changed (since issue 31: its
    # health checks); recorded apart, and the load still must lose nothing.
    routers = {
        "router_pods": identities([p for p in all_pods if router(p)]),
        "router_replicasets": {
            o["metadata"]["name"]: o["metadata"]["uid"] for o in replicasets if router(o)
        },
    }
    revisions = {
        r["metadata"]["name"]: {"uid": r["metadata"]["uid"], "revision": r.get("revision")}
        for r in items("controllerrevisions")
    }
    pdds = {}
    for name in NAMES:
        obj = kind.pdd(namespace, name)
        status = obj.get("status") or {}
        pdds[name] = {
            "uid": obj["metadata"]["uid"],
            "generation": obj["metadata"]["generation"],
            "spec": obj["spec"],
            "observedGeneration": status.get("observedGeneration"),
            "currentRevision": status.get("currentRevision"),
            "updateRevision": status.get("updateRevision"),
            "revisions": [(r.get("revision"), r.get("phase")) for r in status.get("revisions", [])],
        }
    return {
        "pods": pods,
        **owned,
        "controllerrevisions": revisions,
        "pddeployments": pdds,
        **routers,
    }


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What differs between two snapshots, by kind of object: [] when nothing."""
    out: dict[str, Any] = {}
    for key in before:
        old, new = before[key], after[key]
        out[key] = [
            {"name": name, "before": old.get(name), "after": new.get(name)}
            for name in sorted(set(old) | set(new))
            if old.get(name) != new.get(name)
        ]
    return out


def restarted(before: dict[str, Any], after: dict[str, Any]) -> tuple[int, int]:
    """(pods replaced, container restarts) between two snapshots."""
    old = {p["uid"]: p for p in before["pods"].values()}
    new = {p["uid"]: p for p in after["pods"].values()}
    replaced = len(set(old) ^ set(new))
    restarts = sum(
        max(count - old[uid]["restarts"].get(container, 0), 0)
        for uid, pod in new.items()
        if uid in old
        for container, count in pod["restarts"].items()
    )
    return replaced, restarts


def routers_rolled(kind: Kind, namespace: str) -> bool:
    """Every router Deployment's rollout is complete (its controller has seen the last template
    and every replica is updated and available), its old ReplicaSets are pruned to its history
    limit, and its pods are exactly its replicas, none terminating. Pod counts alone also match
    the moment after a template write, before the new ReplicaSet's pod exists (CI saw that)."""
    router = f"{LABEL_ROLE}=router"
    deployments = kind.get("deployments", "-n", namespace, "-l", router)["items"]
    replicasets = kind.get("replicasets", "-n", namespace, "-l", router)["items"]
    pods = kind.get("pods", "-n", namespace, "-l", router)["items"]
    for d in deployments:
        replicas = int(d["spec"].get("replicas") or 0)
        status = d.get("status") or {}
        owned = [
            rs
            for rs in replicasets
            if any(
                o.get("uid") == d["metadata"]["uid"]
                for o in rs["metadata"].get("ownerReferences", [])
            )
        ]
        if (
            status.get("observedGeneration", 0) < d["metadata"]["generation"]
            or int(status.get("updatedReplicas") or 0) != replicas
            or int(status.get("availableReplicas") or 0) != replicas
            or int(status.get("replicas") or 0) != replicas
            or len(owned) > int(d["spec"].get("revisionHistoryLimit", 10)) + 1
        ):
            return False
    wanted = sum(int(d["spec"].get("replicas") or 0) for d in deployments)
    return len(pods) == wanted and not any(p["metadata"].get("deletionTimestamp") for p in pods)


def serving(kind: Kind, namespace: str, names: tuple[str, ...] = NAMES) -> bool:
    for name in names:
        conditions = {
            c["type"]: c["status"]
            for c in (kind.pdd(namespace, name).get("status") or {}).get("conditions", [])
        }
        if conditions.get("Available") != "True" or conditions.get("Progressing") != "False":
            return False
    return True


# ---- the two steps both paths take -------------------------------------------------------------


def serve_under_load(kind: Kind, namespace: str, previous_image: str) -> Serving:
    """The PDDeployments created under the previous operator, Available, and load on each."""
    assert operator_pod(kind, previous_image), f"the previous operator ({previous_image}) runs"
    for name in NAMES:
        kind.apply(spec_for(kind, name), namespace)
    wait_for(lambda: serving(kind, namespace), f"{', '.join(NAMES)} Available", 300, every=2)
    loads = {
        name: LoadRun.start(
            kind, namespace, name, concurrency=2, max_requests=100_000, max_seconds=900
        )
        for name in NAMES
    }
    for load in loads.values():
        load.wait_sending()
    run = Serving(loads, snapshot(kind, namespace))
    run.mark("loaded")
    return run


def upgraded(
    kind: Kind,
    namespace: str,
    run: Serving,
    path: str,
    previous_image: str,
    do: Callable[[], object],
    extra: dict[str, Any],
) -> None:
    """Run the upgrade `do`, wait until the new operator has reconciled every PDDeployment and
    the settle window has passed, and check that nothing of theirs changed."""
    old_pod = operator_pod(kind, previous_image)
    started = time.monotonic()
    do()
    wait_for(lambda: operator_pod(kind, kind.images.operator), "the new operator Ready", 240)
    ready_seconds = time.monotonic() - started

    def counted() -> dict[str, float] | None:
        # Summed over the new replicas: whichever leads reconciles, the standby counts 0.
        per = dict.fromkeys(NAMES, 0.0)
        for replica in operator_pods(kind, kind.images.operator):
            got = reconciles(kind, replica)
            for name in NAMES:
                per[name] += got.get((namespace, name), 0.0)
        return per if all(count >= 1 for count in per.values()) else None

    first = wait_for(counted, "the new operator's reconcile of every PDDeployment", 180)
    reconciled_seconds = time.monotonic() - started

    # Any write the new operator would make follows a reconcile: one more of each PDDeployment
    # (a resync at the latest, every 30 s) is the window, rather than a time that merely passed.
    def reconciled_again() -> dict[str, float] | None:
        now = counted()
        return now if now and all(now[name] > first[name] for name in NAMES) else None

    settled = wait_for(reconciled_again, "a second reconcile of every PDDeployment", 120)
    settle_seconds = time.monotonic() - started - reconciled_seconds
    after = snapshot(kind, namespace)
    run.mark("upgraded")
    replaced, restarts = restarted(run.before, after)
    diff = changes(run.before, after)
    figures = {
        "from_image": previous_image,
        "to_image": kind.images.operator,
        "operator_ready_seconds": round(ready_seconds, 1),
        "reconciled_seconds": round(reconciled_seconds, 1),
        "reconciles_first_seen": first,
        "reconciles_after_settle": settled,
        "settle_seconds": round(settle_seconds, 1),
        "workload_pods": len(after["pods"]),
        "pods_replaced": replaced,
        "container_restarts": restarts,
        "revisions": {n: p["currentRevision"] for n, p in after["pddeployments"].items()},
        "controller_revisions": len(after["controllerrevisions"]),
        # The router Deployments roll where the new release renders other router args.
        "router_replicasets_changed": len(diff["router_replicasets"]),
        "router_pods_replaced": len(diff["router_pods"]),
        "requests_during_upgrade": {
            key: run.marks["upgraded"][key] - run.marks["loaded"][key]
            for key in run.marks["upgraded"]
        },
    }
    record(f"{path}: upgrade", {**extra, **figures})

    # A rolling update (two replicas electing, since issue 31) stops the previous operator once
    # the new ones are Ready: its pod may still be terminating here. v0.1.0 elects no leader, so
    # until it is gone it still writes its own router args, and the routers may roll again.
    def operators() -> list[str]:
        return [p["metadata"]["name"] for p in kind.pods(OPERATOR_NAMESPACE, OPERATOR_SELECTOR)]

    assert old_pod
    wait_for(lambda: old_pod not in operators(), "the previous operator's pod gone", 120)
    # The uninstall that follows must leave them exactly as the upgrade left them, once the
    # previous operator is gone and the routers' roll is over.
    wait_for(lambda: routers_rolled(kind, namespace), "the routers' roll over", 180)
    run.before = snapshot(kind, namespace)
    engines = {k: changed for k, changed in diff.items() if not k.startswith("router_")}
    assert all(not changed for changed in engines.values()), json.dumps(engines, indent=1)
    assert replaced == 0 and restarts == 0
    failed = {k: v for k, v in run.marks["upgraded"].items() if k.endswith("_failed") and v}
    assert not failed, (
        failed,
        {n: (load.progress() or {}).get("errors") for n, load in run.loads.items()},
    )
    assert serving(kind, namespace)


def stop_loads(run: Serving) -> dict[str, Any]:
    for load in run.loads.values():
        load.stop()
    summaries = {name: load.summary() for name, load in run.loads.items()}
    figures = {
        name: {
            key: s[key]
            for key in ("sent", "ok", "failed", "cross_revision", "pairs", "errors", "seconds")
        }
        for name, s in summaries.items()
    }
    for name, s in summaries.items():
        assert s["stopped_by"] == "stop file", f"{name}: the loop ended before the steps did"
        assert s["failed"] == 0, (name, s["errors"])
        assert s["cross_revision"] == 0, (name, s["pairs"])
    return figures


def gone(kind: Kind, namespace: str) -> bool:
    """The CRDs, and with them the PDDeployments, and every workload pod of the namespace."""
    pods = kind.get("pods", "-n", namespace, "-l", LABEL_NAME)["items"]
    return crds_gone(kind) and not pods


# ---- the tests -----------------------------------------------------------------------------------


def test_kustomize_upgrade_then_uninstall_and_purge(
    kind: Kind, upgrade: Upgrade, helm: Helm, overlays: dict[str, Path], namespace: str
) -> None:
    # 1. The previous release, from its own deploy/, serving under load.
    started = time.monotonic()
    remove_pdmtp(kind, helm, upgrade.overlay)
    install_kustomize(kind, overlays["previous"])
    installed_seconds = round(time.monotonic() - started, 1)
    run = serve_under_load(kind, namespace, upgrade.image)
    # 2. This tree's deploy/ applied over it.
    upgraded(
        kind,
        namespace,
        run,
        "kustomize",
        upgrade.image,
        lambda: install_kustomize(kind, upgrade.overlay),
        {"previous_release": upgrade.release, "previous_installed_seconds": installed_seconds},
    )

    # 3. The operator deleted: they keep serving, and the CRDs refuse deletion.
    started = time.monotonic()
    kind.kubectl("delete", "-k", str(overlays["current-operator"]), "--wait=true", timeout=300)
    wait_for(lambda: operator_gone(kind), "the operator gone", 120)
    uninstall_seconds = time.monotonic() - started
    try:
        kind.kubectl("delete", "crd", CRDS[0], "--wait=false")
        refusal = ""
    except KubectlError as exc:
        refusal = str(exc)
    for load in run.loads.values():
        load.wait_answers()  # with no operator
    after = snapshot(kind, namespace)
    replaced, restarts = restarted(run.before, after)
    run.mark("operator deleted")
    loads = stop_loads(run)
    # 4. The purge.
    started = time.monotonic()
    kind.kubectl("annotate", "crd", *CRDS, f"{ALLOW_DELETE}=true", "--overwrite")
    kind.kubectl(
        "delete", "-k", str(upgrade.overlay), "--ignore-not-found", "--wait=true", timeout=300
    )
    wait_for(lambda: gone(kind, namespace), "CRDs, PDDeployments and pods gone", 180)
    purge_seconds = time.monotonic() - started
    record(
        "kustomize: uninstall",
        {
            "delete_operator_seconds": round(uninstall_seconds, 1),
            "crd_delete_refused": refusal,
            "pods_replaced": replaced,
            "container_restarts": restarts,
            "load": loads,
            "purge_seconds": round(purge_seconds, 1),
        },
    )
    assert ALLOW_DELETE in refusal, f"`kubectl delete crd {CRDS[0]}` was not refused: {refusal}"
    diff = changes(run.before, after)
    assert all(not changed for changed in diff.values()), json.dumps(diff, indent=1)
    assert replaced == 0 and restarts == 0


def test_helm_upgrade_then_uninstall_and_purge(
    kind: Kind, upgrade: Upgrade, helm: Helm, namespace: str
) -> None:
    # 1. The previous release, from its own chart, serving under load.
    chart = upgrade.tree / "charts/pdmtp"
    current_chart = str(REPO / "charts/pdmtp")
    assert chart.is_dir(), (
        f"the previous release {upgrade.release} ({upgrade.tree.name}) has no charts/pdmtp: "
        "versions.env PREVIOUS_RELEASE_COMMIT must be a release with the Helm chart"
    )
    started = time.monotonic()
    remove_pdmtp(kind, helm, upgrade.overlay)
    helm(
        "install",
        RELEASE,
        str(chart),
        "-n",
        OPERATOR_NAMESPACE,
        "--create-namespace",
        *image_values(upgrade.image),
    )
    operator_rolled_out(kind)
    installed_seconds = round(time.monotonic() - started, 1)
    run = serve_under_load(kind, namespace, upgrade.image)
    # 2. `helm upgrade` to this tree's chart and image.
    upgraded(
        kind,
        namespace,
        run,
        "helm",
        upgrade.image,
        lambda: helm(
            "upgrade",
            RELEASE,
            current_chart,
            "-n",
            OPERATOR_NAMESPACE,
            *image_values(kind.images.operator),
        ),
        {"previous_release": upgrade.release, "previous_installed_seconds": installed_seconds},
    )

    # 3. `helm uninstall`: they keep serving, the CRDs stay.
    started = time.monotonic()
    helm("uninstall", RELEASE, "-n", OPERATOR_NAMESPACE)
    wait_for(lambda: operator_gone(kind), "the operator gone", 120)
    uninstall_seconds = time.monotonic() - started
    for load in run.loads.values():
        load.wait_answers()  # with no operator
    after = snapshot(kind, namespace)
    replaced, restarts = restarted(run.before, after)
    kept = kind.kubectl("get", "crd", *CRDS, "-o", "name").split()
    run.mark("uninstalled")
    loads = stop_loads(run)

    # 4. Installed again (it takes over the CRDs it left), then purged.
    helm(
        "install",
        RELEASE,
        current_chart,
        "-n",
        OPERATOR_NAMESPACE,
        *image_values(kind.images.operator),
    )
    operator_rolled_out(kind)
    assert serving(kind, namespace)
    # This tree's chart, installed by helm, serves a PDDeployment it has never seen.
    started = time.monotonic()
    kind.apply(spec_for(kind, FRESH), namespace)
    wait_for(lambda: serving(kind, namespace, (FRESH,)), f"{FRESH} Available", 300, every=2)
    fresh_available_seconds = round(time.monotonic() - started, 1)
    started = time.monotonic()
    helm(
        "upgrade",
        RELEASE,
        current_chart,
        "-n",
        OPERATOR_NAMESPACE,
        "--reuse-values",
        "--set",
        "crds.keep=false",
    )
    helm("uninstall", RELEASE, "-n", OPERATOR_NAMESPACE)
    wait_for(lambda: gone(kind, namespace), "CRDs, PDDeployments and pods gone", 180)
    purge_seconds = time.monotonic() - started
    record(
        "helm: uninstall",
        {
            "uninstall_seconds": round(uninstall_seconds, 1),
            "crds_kept": kept,
            "pods_replaced": replaced,
            "container_restarts": restarts,
            "load": loads,
            "purge_seconds": round(purge_seconds, 1),
            "fresh_available_seconds": fresh_available_seconds,
        },
    )
    assert sorted(kept) == sorted(
        f"customresourcedefinition.apiextensions.k8s.io/{c}" for c in CRDS
    )
    diff = changes(run.before, after)
    assert all(not changed for changed in diff.values()), json.dumps(diff, indent=1)
    assert replaced == 0 and restarts == 0
