"""The README's first command: `make demo`, exactly as a user runs it, against a state directory of
its own (DEMO_DIR), then `make demo-down`. Fails unless the story completes: the control plane up,
the CRDs served, the operator running, the PDDeployment Available, the paired MTP rollout to the
new revision, the printed `export KUBECONFIG` line; and unless demo-down leaves nothing running.

It needs no fixture of the tier: the demo starts its own control plane (from the binaries the
tier builds) and its own operator, on ports of their own."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from cluster.kubehelpers import wait_for
from pdmtp.api import vocabulary as v

REPO = Path(__file__).resolve().parents[2]
DEMO_TIMEOUT = 420  # seconds; ~40 s on a quiet warm machine, cluster-bins up to date


def make(target: str, demo_dir: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), target, f"DEMO_DIR={demo_dir}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def demo_processes(demo_dir: Path) -> dict[str, int]:
    """Every process the demo recorded (control plane components, the operator) still alive."""
    state_file = demo_dir / "state.json"
    state = json.loads(state_file.read_text(encoding="utf-8")) if state_file.exists() else {}
    recorded: dict[str, tuple[int, float | None]] = {
        name: (pid, started) for name, (pid, started) in state.get("pids", {}).items()
    }
    for process in ("operator", "engines"):  # the engines: hack/lib/demo_engines.py
        pid_file = demo_dir / f"{process}.pid"
        if pid_file.exists():
            recorded[process] = (int(pid_file.read_text(encoding="utf-8")), None)
    alive = {}
    for name, (pid, started) in recorded.items():
        try:
            proc = psutil.Process(pid)
            ours = started is None or abs(proc.create_time() - started) < 1
            if ours and proc.status() != psutil.STATUS_ZOMBIE:
                alive[name] = pid
        except psutil.NoSuchProcess:
            continue
    return alive


def demo_ports(demo_dir: Path) -> dict[str, int]:
    """The control plane's ports and the operator's (metrics, health), where recorded."""
    ports: dict[str, int] = {}
    state, operator = demo_dir / "state.json", demo_dir / "operator.ports"
    if state.exists():
        ports |= json.loads(state.read_text(encoding="utf-8")).get("ports", {})
    if operator.exists():
        metrics, health = operator.read_text(encoding="utf-8").split()
        ports |= {"operator metrics": int(metrics), "operator health": int(health)}
    return ports


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def kubectl_json(demo_dir: Path, *args: str) -> Any:
    state = json.loads((demo_dir / "state.json").read_text(encoding="utf-8"))
    done = subprocess.run(
        [str(Path(state["bin_dir"]) / "kubectl"), *args, "-o", "json"],
        env={**os.environ, "KUBECONFIG": str(demo_dir / "kubeconfig")},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(done.stdout)


def condition(pdd: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in pdd["status"]["conditions"] if c["type"] == kind)


def test_make_demo_then_demo_down(tmp_path: Path) -> None:
    demo_dir = tmp_path / "demo"
    started = time.monotonic()
    try:
        demo = make("demo", demo_dir, DEMO_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        make("demo-down", demo_dir, 120)
        pytest.fail(f"make demo did not finish in {DEMO_TIMEOUT} s:\n{exc.stdout}\n{exc.stderr}")
    took = time.monotonic() - started
    print(f"make demo: exit {demo.returncode} in {took:.1f} s\n{demo.stdout}\n{demo.stderr}")
    try:
        assert demo.returncode == 0, f"make demo failed:\n{demo.stdout[-4000:]}\n{demo.stderr}"
        out = demo.stdout
        assert "customresourcedefinition/pddeployments.pdmtp.io served" in out
        assert "pddeployment.pdmtp.io/demo condition met" in out  # kubectl wait: Available
        assert f"export KUBECONFIG={demo_dir / 'kubeconfig'}" in out
        assert f"make demo-down DEMO_DIR={demo_dir}" in out

        # What the demo claims, read back from the API server: the MTP change (k 3 -> 2) rolled
        # out in full, to the revision `pdmtp validate` computes for the changed sample.
        sample = yaml.safe_load((REPO / "samples" / "demo.yaml").read_text(encoding="utf-8"))
        sample["spec"]["speculative"]["numSpeculativeTokens"] = 2
        changed = tmp_path / "changed.yaml"
        changed.write_text(yaml.safe_dump(sample), encoding="utf-8")
        verdict = subprocess.run(
            [str(Path(sys.executable).parent / "pdmtp"), "validate", "-o", "json", str(changed)],
            capture_output=True,
            text=True,
            check=True,
        )
        target = json.loads(verdict.stdout)["revision"]
        assert f"rolling to revision {target}" in out
        # The verdict, shown: the first revision Verified (`pdmtp verify` exiting 0 ends the
        # step), then the release that drafts worse rolled back on AcceptanceRegressed, and the
        # spec put back, Verified again.
        assert "Verified=True (HandoffVerified)" in out
        assert "was judged AcceptanceRegressed" in out, out[-4000:]
        pdd = kubectl_json(demo_dir, "get", "pdd", "demo")
        assert pdd["spec"]["speculative"]["numSpeculativeTokens"] == 2
        assert pdd["spec"]["model"].get("revision") != "worse-drafter"
        assert "env" not in pdd["spec"]["decode"]
        assert pdd["status"]["currentRevision"] == target
        assert condition(pdd, "Progressing")["reason"] == "RolloutComplete"
        assert condition(pdd, "Available")["status"] == "True"
        assert condition(pdd, "Verified")["status"] == "True"

        def revisions_left() -> set[str]:
            pods = kubectl_json(demo_dir, "get", "pods", "-l", v.LABEL_REVISION)["items"]
            return {p["metadata"]["labels"][v.LABEL_REVISION] for p in pods}

        # The old revision's pods drain for drainSeconds (5 s) after the rollout completes.
        wait_for(lambda: revisions_left() == {target}, f"only revision {target}'s pods", 60, 1)
        processes = demo_processes(demo_dir).keys()
        assert processes >= {"etcd", "kube-apiserver", "operator", "engines"}
    finally:
        ports = demo_ports(demo_dir)
        down = make("demo-down", demo_dir, 120)
    print(f"make demo-down: exit {down.returncode}\n{down.stdout}\n{down.stderr}")
    assert down.returncode == 0, down.stderr
    assert ports.keys() >= {"apiserver", "operator metrics"}, ports
    # Nothing left running: every recorded process gone, every port of the demo closed.
    wait_for(lambda: not demo_processes(demo_dir), "the demo's processes gone", 30, 0.5)
    open_ports = {name: port for name, port in ports.items() if listening(port)}
    assert not open_ports, f"ports still listening after make demo-down: {open_ports}"
