"""The README's "A first PDDeployment" and docs/operations.md's "Install on a real cluster" steps 3
and 4 with kubectl as written: a PDDeployment file applied, listed (the printer columns the
README's comment names), changed and watched, then described (the operator's events); and
`hack/corev1-snapshot.py` against the pinned API server (issue 33: every documented command under
a test; the registry is tests/unit/readme_commands.py).

samples/full.yaml never becomes Available here: its prefill's H200 nodeSelector matches no fake
node (the README says to edit it first), so REVISION, the serving revision, stays empty.
`kubectl wait --for=condition=Available` runs in test_operator.py and in the demo."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml
from cluster.kubehelpers import Cluster, wait_for
from operator_harness import OperatorProcess

REPO = Path(__file__).resolve().parents[2]
# The columns the README's comment names after `kubectl get pdd -n serving`.
COLUMNS = ["NAME", "READY", "PREFILL", "DECODE", "LOOKAHEAD", "REVISION", "AGE"]


def kubectl_argv(cluster: Cluster, *args: str) -> list[str]:
    binary = cluster.local.bin_dir / "kubectl" if cluster.local else Path("kubectl")
    return [str(binary), "--kubeconfig", str(cluster.kubeconfig), *args]


def kubectl(cluster: Cluster, cwd: Path, *args: str) -> str:
    done = subprocess.run(
        kubectl_argv(cluster, *args), cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout


def sample_in(namespace: str, dest: Path, **speculative: int) -> Path:
    """samples/full.yaml with its namespace (`serving`) swapped for the test's."""
    doc = yaml.safe_load((REPO / "samples" / "full.yaml").read_text(encoding="utf-8"))
    assert doc["metadata"]["namespace"] == "serving"
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["speculative"].update(speculative)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return dest


def watch_lines(argv: list[str], until: int, timeout: float) -> list[str]:
    """The first `until` lines `kubectl get -w` prints (fewer if `timeout` passes); then stopped."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in proc.stdout or []:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    got: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < until and time.monotonic() < deadline:
            try:
                got.append(lines.get(timeout=0.5).rstrip("\n"))
            except queue.Empty:
                if proc.poll() is not None and lines.empty():
                    break
    finally:
        proc.kill()
        proc.wait(timeout=10)
    return got


def test_a_pddeployment_file_applied_listed_watched_and_described(
    cluster: Cluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    sample_in(namespace, tmp_path / "samples" / "full.yaml")
    out = kubectl(cluster, tmp_path, "apply", "-f", "samples/full.yaml")
    assert out.strip() == "pddeployment.pdmtp.io/inkling created", out

    def listed() -> dict[str, str] | None:
        text = kubectl(cluster, tmp_path, "get", "pdd", "-n", namespace)
        header, *rows = text.splitlines()
        assert header.split() == COLUMNS, text
        (row,) = rows
        # Cells by the header's columns: REVISION (the serving one) stays empty here.
        starts = [header.index(c) for c in COLUMNS] + [len(row) + 1]
        cells = {c: row[a:b].strip() for c, a, b in zip(COLUMNS, starts, starts[1:], strict=False)}
        return cells if cells["LOOKAHEAD"] else None  # the operator's first status write

    cells = wait_for(listed, "kubectl get pdd showing the operator's status", 30, 0.5)
    assert (cells["NAME"], cells["READY"], cells["LOOKAHEAD"]) == ("inkling", "False", "3")
    assert cells["PREFILL"].endswith("/2") and cells["DECODE"].endswith("/4"), cells

    # Step 4: a changed MTP config applied, and the watch shows the operator's status writes.
    sample_in(namespace, tmp_path / "new.yaml", numSpeculativeTokens=2)
    out = kubectl(cluster, tmp_path, "apply", "-f", "new.yaml")
    assert out.strip() == "pddeployment.pdmtp.io/inkling configured", out
    watched = watch_lines(kubectl_argv(cluster, "get", "pdd", "-n", namespace, "-w"), 3, 60)
    assert watched and watched[0].split() == COLUMNS, watched
    assert len(watched) == 3 and all(line.startswith("inkling ") for line in watched[1:]), watched

    def events() -> str | None:
        text = kubectl(cluster, tmp_path, "describe", "pdd", "inkling", "-n", namespace)
        return text if "Created" in text.partition("Events:")[2] else None

    described = wait_for(events, "the operator's events in kubectl describe", 30, 0.5)
    assert "Num Speculative Tokens:  2" in described, described


def test_the_corev1_snapshot_is_what_the_pinned_api_server_serves(
    cluster: Cluster, tmp_path: Path
) -> None:
    """`hack/corev1-snapshot.py` exactly as the README runs it (no arguments: a control plane of
    its own at the pinned version), in a scratch tree holding the script and hack/lib, so
    that what it writes lands there: it reproduces the committed operator/pdmtp/api/corev1.json.
    (`cluster`: the tier's control-plane binaries are built.)"""
    (tmp_path / "hack").mkdir()
    shutil.copy2(REPO / "hack" / "corev1-snapshot.py", tmp_path / "hack")
    (tmp_path / "hack" / "lib").symlink_to(REPO / "hack" / "lib")
    written = tmp_path / "operator" / "pdmtp" / "api" / "corev1.json"
    written.parent.mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "hack/corev1-snapshot.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    committed = REPO / "operator" / "pdmtp" / "api" / "corev1.json"
    assert json.loads(written.read_text()) == json.loads(committed.read_text())
    assert written.read_text() == committed.read_text()
