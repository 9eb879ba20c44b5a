"""The README's `pdmtp`, shell and make examples, run as written (from the repository root, the
installed console script), with what the README says they print (issue 33; the registry of every
README command is tests/unit/readme_commands.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pdmtp
import yaml
from builders import compat_revision
from pdmtp.cli.inputs import load_one

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
PDMTP = VENV / "bin" / "pdmtp"


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def changed(sample: str, tmp_path: Path, **rollout: object) -> Path:
    """new.yaml: the sample with numSpeculativeTokens 3 -> 2 (and `rollout` fields merged in)."""
    doc = yaml.safe_load((REPO / "samples" / sample).read_text(encoding="utf-8"))
    assert doc["spec"]["speculative"]["numSpeculativeTokens"] == 3
    doc["spec"]["speculative"]["numSpeculativeTokens"] = 2
    doc["spec"].setdefault("rollout", {}).update(rollout)
    path = tmp_path / "new.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def revision(path: Path | str) -> str:
    """The compat revision `pdmtp validate` names (in process: the examples run the script)."""
    return compat_revision(load_one(str(REPO / path)).spec)


def test_version_prints_the_project_version() -> None:
    done = run(str(PDMTP), "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"pdmtp {pdmtp.__version__}"


def test_validate_the_full_sample() -> None:
    done = run(str(PDMTP), "validate", "samples/full.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    rev = revision("samples/full.yaml")
    assert (
        done.stdout == f"samples/full.yaml: compatible (lookahead prefill=3 decode=3, "
        f"prefill backoff 2, revision {rev})\n"
        "  verification: Rollback (falseRollbackPercent 1, smallestRegressionPercent 10, "
        "minRequests 8, minDrafts 32, replaceAfterFailedPulls 3, probeRequestsPerMinute 12)\n"
        "  decode kv_load_failure_policy: fail (a KV load that fails fails its request; unset: "
        "vLLM's default)\n"
    )


def test_validate_and_render_the_production_sample() -> None:
    """`pdmtp validate` and `pdmtp render` show what samples/production.yaml becomes."""
    assert run(str(PDMTP), "validate", "samples/production.yaml").returncode == 0
    done = run(str(PDMTP), "render", "samples/production.yaml")
    assert done.returncode == 0, done.stderr
    kinds = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(done.stdout) if d}
    rev = revision("samples/production.yaml")
    name = yaml.safe_load((REPO / "samples/production.yaml").read_text())["metadata"]["name"]
    for role in ("prefill", "decode", "router"):
        assert ("Deployment", f"{name}-{rev}-{role}") in kinds, sorted(kinds)


def test_plan_from_the_full_sample_to_a_changed_mtp_config(tmp_path: Path) -> None:
    new = changed("full.yaml", tmp_path)
    done = run(str(PDMTP), "plan", "--from", "samples/full.yaml", "--to", str(new))
    assert done.returncode == 0, done.stdout + done.stderr
    old_rev, new_rev = revision("samples/full.yaml"), revision(new)
    assert f"Paired rollout {old_rev} -> {new_rev} completed" in done.stdout, done.stdout
    assert "invariants" in done.stdout.splitlines()[-1]


def test_plan_of_the_canary_example_on_the_demo(tmp_path: Path) -> None:
    """The README: the new revision reaches one prefill and one decode next to the old
    revision's one and one (both serving), the hold, and after promotion the old revision
    un-routed, drained for drainSeconds and retired."""
    new = changed("demo.yaml", tmp_path, canary={"percent": 50})
    done = run(str(PDMTP), "plan", "--from", "samples/demo.yaml", "--to", str(new))
    assert done.returncode == 0, done.stdout + done.stderr
    old, rev = revision("samples/demo.yaml"), revision(new)
    before, hold, after = done.stdout.partition("Canary holds:")
    assert hold, done.stdout
    half = "P 1/1 D 1/1 R 1 serving"
    assert any(line.count(half) == 2 for line in before.splitlines()), before
    assert f"{rev} serves 50% of each role next to {old}" in after
    assert "`pdmtp rollout promote` continues" in after
    assert f"unroute {old}" in after and "draining" in after and f"retire {old}" in after
    assert f"Paired rollout {old} -> {rev} completed" in after


def test_plan_with_fail_after_prints_the_rollback(tmp_path: Path) -> None:
    new = changed("demo.yaml", tmp_path)
    args = ("plan", "--from", "samples/demo.yaml", "--to", str(new), "--fail-after", "3")
    done = run(str(PDMTP), *args)
    assert done.returncode == 0, done.stdout + done.stderr
    old, rev = revision("samples/demo.yaml"), revision(new)
    assert f"{rev} fails" in done.stdout and f"rolling back to {old}" in done.stdout
    assert f"retire {rev}" in done.stdout
    assert f"Rollback {rev} -> {old} completed" in done.stdout  # from the failed revision back


def test_the_image_build_variables() -> None:
    """Step 1's shell lines: versions.env's pins exported for the engine's build args, and
    VERSION read from pyproject.toml is the project's version."""
    script = "\n".join(
        [
            "set -a && . ./versions.env && set +a",
            "VERSION=$(sed -n 's/^version = \"\\(.*\\)\"/\\1/p' pyproject.toml)",
            "bash -c 'echo \"$VLLM_VERSION $MOONCAKE_VERSION\"'",
            'echo "$VERSION"',
        ]
    )
    done = run("bash", "-euc", script)
    assert done.returncode == 0, done.stderr
    exported, version = done.stdout.splitlines()
    vllm, mooncake = exported.split()
    assert vllm == "0.33.0" and mooncake  # the engine image's tag in the README is vLLM's
    assert version == pdmtp.__version__


def make(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """make with this interpreter's venv, never rebuilt (-o): the test runs inside it."""
    return run(
        "make", "--no-print-directory", "-f", str(REPO / "Makefile"), f"VENV={VENV}",
        "-o", f"{VENV}/.installed", *args, cwd=cwd,
    )  # fmt: skip


def test_make_verify() -> None:
    done = make("verify")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr


def test_make_generate_in_a_scratch_copy(tmp_path: Path) -> None:
    """The target writes crds/, the chart's copy, docs/api-reference.md and README.md's
    generated tables; run where it writes a copy of them, it must give the committed files."""
    for part in ("crds", "charts/pdmtp/files/crds", "docs"):
        shutil.copytree(REPO / part, tmp_path / part)
    for generated in (tmp_path / "crds").glob("pdmtp.io_*.yaml"):
        generated.write_text("stale\n")
    readme = (REPO / "README.md").read_text()
    start, end = "<!-- generated:troubleshooting -->\n", "<!-- /generated:troubleshooting -->"
    stale = readme[: readme.index(start) + len(start)] + readme[readme.index(end) :]
    (tmp_path / "README.md").write_text(stale)
    done = make("generate", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for part in ("crds", "charts/pdmtp/files/crds"):
        for path in sorted((REPO / part).iterdir()):
            assert (tmp_path / part / path.name).read_text() == path.read_text(), path
    for made in ("docs/api-reference.md", "README.md"):
        assert (tmp_path / made).read_text() == (REPO / made).read_text(), made


def test_render_the_multinode_sample_shows_groups_ranks_and_gangs() -> None:
    """`pdmtp render samples/multinode.yaml`: decode as 2 groups of 2 pods under one PodGroup
    each (a gang of 2, one rack), the leader at rank 0 and the worker headless from rank 8."""
    done = run(str(PDMTP), "render", "samples/multinode.yaml")
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    groups = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "PodGroup"}
    assert len(groups) == 2, sorted(groups)
    for spec in groups.values():
        assert spec["schedulingPolicy"] == {"gang": {"minCount": 2}}
        assert spec["schedulingConstraints"] == {"topology": [{"key": "example.com/rack"}]}
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert len(pods) == 4
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in pods} == set(groups)
    for pod in pods:
        args = pod["spec"]["containers"][0]["args"]
        worker = pod["metadata"]["name"].endswith("-1")
        assert ("--headless" in args) == worker, args
        if worker:
            assert args[args.index("--data-parallel-start-rank") + 1] == "8"
        assert args[args.index("--data-parallel-size-local") + 1] == "8"
