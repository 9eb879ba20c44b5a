"""An operator upgrade must not roll what the previous release deployed: the previous release's
own samples, rendered by its code and by this tree's, give the same Deployments (names, so the
same revisions; selectors; pod templates). A changed default that would replace pods fails here,
in seconds, before the kind tier's upgrade test would see the roll (tests/e2e/test_upgrade.py).

The previous release is versions.env's PREVIOUS_RELEASE_COMMIT, read from this clone's history
(`git archive`); its code runs in a subprocess with this venv's dependencies (pinned alike). A
control renders the same way against a release known to render engine pods differently, so the
comparison is shown able to fail.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from versions import read_versions

REPO = Path(__file__).resolve().parents[2]

CONTROL_COMMIT = "246d355"
"""The commit before the engines' metrics-only port (002be39): its engine pod template has
no `metrics` port 29100 and no PDMTP_METRICS_PORT, so upgrading from it replaces every engine pod
(the issue 21 note says so). The check must see that."""


def extract(commit: str, into: Path) -> Path:
    """The commit's operator package and samples, as `git archive` gives them."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "operator", "samples"],
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    if archive.returncode != 0:
        pytest.fail(
            f"commit {commit} is not in this clone ({archive.stderr.decode().strip()}): "
            "the release-compatibility check needs the repository's history (a full clone)"
        )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def render_with(tree: Path, sample: Path) -> list[dict[str, Any]]:
    """`pdmtp render` of the given tree's code (this tree's too: both sides run the same way)."""
    # The package must come from `tree`, not from the venv's (editable) install of this one.
    run = (
        "import sys, pdmtp; from pathlib import Path; "
        "assert Path(pdmtp.__file__).is_relative_to(sys.argv[1]), pdmtp.__file__; "
        "from pdmtp.cli import main; sys.exit(main(sys.argv[2:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", run, str(tree), "render", str(sample), "-o", "json"],
        env={"PYTHONPATH": str(tree / "operator"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{tree} could not render {sample.name}: {done.stderr[-2000:]}"
    items: list[dict[str, Any]] = json.loads(done.stdout)["items"]
    return items


WORKLOADS = frozenset({"Deployment", "Pod", "PodGroup"})
"""The children that are or make pods. Any other child added or dropped by an upgrade (this
tree's PodDisruptionBudgets) is written beside the pods and replaces none."""


def differences(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    """What an upgrade would change in the pods: workloads gone or added (a Deployment's name
    carries its revision) and, per Deployment, its selector or pod template."""
    by_key = {(o["kind"], o["metadata"]["name"]): o for o in old if o["kind"] in WORKLOADS}
    new_by_key = {(o["kind"], o["metadata"]["name"]): o for o in new if o["kind"] in WORKLOADS}
    found = [f"only the previous release renders {k}" for k in sorted(by_key.keys() - new_by_key)]
    found += [f"only this tree renders {k}" for k in sorted(new_by_key.keys() - by_key)]
    for key in sorted(by_key.keys() & new_by_key.keys()):
        if key[0] != "Deployment":
            continue
        for part in ("selector", "template"):
            was, now = by_key[key]["spec"][part], new_by_key[key]["spec"][part]
            if was != now:
                found.append(f"{key[1]}: spec.{part} differs\n  was {was}\n  now {now}")
    return found


def compare_release(commit: str, tmp_path: Path) -> dict[str, list[str]]:
    tree = extract(commit, tmp_path / commit)
    samples = sorted((tree / "samples").glob("*.yaml"))
    assert samples, f"{commit} has no samples"
    return {s.name: differences(render_with(tree, s), render_with(REPO, s)) for s in samples}


def test_upgrading_from_the_previous_release_rolls_nothing(tmp_path: Path) -> None:
    pins = read_versions()
    found = compare_release(pins["PREVIOUS_RELEASE_COMMIT"], tmp_path)
    assert found and all(not d for d in found.values()), (
        f"upgrading from {pins['PREVIOUS_RELEASE']} would replace pods:\n"
        + "\n".join(f"{name}: {d}" for name, ds in found.items() for d in ds)
    )


def test_control_a_release_that_rendered_engines_differently_is_caught(tmp_path: Path) -> None:
    found = compare_release(CONTROL_COMMIT, tmp_path)
    changed = [d for ds in found.values() for d in ds]
    assert changed, "the comparison found nothing against a release known to differ"
    engine_templates = [d for d in changed if "spec.template differs" in d and "-prefill" in d]
    assert engine_templates and any("29100" in d for d in engine_templates), changed
