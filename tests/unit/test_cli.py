"""`pdmtp` as a user runs it: exit codes, JSON shape, clear errors and no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import pdd
from pdmtp.cli import main

REPO = Path(__file__).resolve().parents[2]
SAMPLES = sorted((REPO / "samples").glob("*.yaml"))


def run_cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, obj: Any, name: str = "pdd.yaml") -> str:
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else yaml.safe_dump(obj))
    return str(path)


def test_samples_validate(capsys: pytest.CaptureFixture[str]) -> None:
    assert len(SAMPLES) >= 2
    code, out, _ = run_cli("validate", *map(str, SAMPLES), capsys=capsys)
    assert code == 0 and out.count(": compatible") == len(SAMPLES)


def test_validate_json_shape(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, pdd().mtp(3, modules=3).dict())
    code, out, _ = run_cli("validate", "-o", "json", path, capsys=capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc == {
        "compatible": True,
        "lookahead": {"prefill": 3, "decode": 3},
        "prefillBackoff": 2,
        "revision": doc["revision"],
        "reasons": [],
        "verification": {
            "mode": "Rollback",
            "falseRollbackPercent": 1.0,
            "smallestRegressionPercent": 10,
            "minRequests": 8,
            "minDrafts": 32,
            "expectedAcceptanceLength": None,
            "replaceAfterFailedPulls": 3,
            "probeRequestsPerMinute": 12,
        },
        "loadFailurePolicy": "fail",
    }
    assert len(doc["revision"]) == 8


def test_validate_names_the_verification_knobs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    knobs = {"mode": "Gate", "expectedAcceptanceLength": 1.5, "replaceAfterFailedPulls": 0}
    path = write(tmp_path, pdd().set(verification=knobs).dict())
    code, out, _ = run_cli("validate", path, capsys=capsys)
    assert code == 0
    assert out.splitlines()[1] == (
        "  verification: Gate (falseRollbackPercent 1, smallestRegressionPercent 10, "
        "minRequests 8, minDrafts 32, expectedAcceptanceLength 1.5, replaceAfterFailedPulls 0, "
        "probeRequestsPerMinute 12)"
    )
    # The deprecated tolerance stands for the smallest regression where that is unset.
    knobs = {"acceptanceTolerancePercent": 20, "falseRollbackPercent": 0.1}
    path = write(tmp_path, pdd().set(verification=knobs).dict())
    code, out, _ = run_cli("validate", path, capsys=capsys)
    assert "(falseRollbackPercent 0.1, smallestRegressionPercent 20, minRequests" in out
    knobs = {"acceptanceTolerancePercent": 20, "smallestRegressionPercent": 5}
    path = write(tmp_path, pdd().set(verification=knobs).dict())
    code, out, _ = run_cli("validate", path, capsys=capsys)
    assert "smallestRegressionPercent 5," in out and "20" not in out.splitlines()[1]
    path = write(tmp_path, pdd().set(verification={"mode": "Off"}).dict())
    code, out, _ = run_cli("validate", path, capsys=capsys)
    assert out.splitlines()[1] == "  verification: Off (nothing is judged)"
    path = write(tmp_path, pdd().set(verification={"replaceAfterFailedPulls": -1}).dict())
    code, out, _ = run_cli("validate", path, capsys=capsys)
    assert code == 2 and "spec.verification.replaceAfterFailedPulls" in out
    path = write(tmp_path, pdd().set(verification={"falseRollbackPercent": 50}).dict())
    code, out, _ = run_cli("validate", path, capsys=capsys)
    assert code == 2 and "spec.verification.falseRollbackPercent" in out


def test_validate_shows_the_decodes_kv_load_failure_policy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(tmp_path, pdd().dict())
    code, out, _ = run_cli("validate", path, capsys=capsys)
    assert out.splitlines()[2] == (
        "  decode kv_load_failure_policy: fail (a KV load that fails fails its request; unset: "
        "vLLM's default)"
    )
    path = write(tmp_path, pdd().set(kvTransfer={"loadFailurePolicy": "recompute"}).dict())
    code, out, _ = run_cli("validate", path, capsys=capsys)
    assert code == 0 and out.splitlines()[2] == (
        "  decode kv_load_failure_policy: recompute (a KV load that fails is recomputed by the "
        "decode)"
    )
    path = write(tmp_path, pdd().set(kvTransfer={"loadFailurePolicy": "retry"}).dict())
    code, out, _ = run_cli("validate", path, capsys=capsys)
    assert code == 2 and "spec.kvTransfer.loadFailurePolicy" in out, out


def test_incompatible_exits_1_naming_the_fields(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(tmp_path, pdd().mtp(3).prefill(k=2).dict())
    code, out, _ = run_cli("validate", "-o", "json", path, capsys=capsys)
    doc = json.loads(out)
    assert code == 1 and doc["compatible"] is False and doc["revision"] is None
    assert doc["reasons"][0]["reason"] == "MTPModulesUnknown"
    assert "spec.model.mtpModules" in doc["reasons"][0]["message"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("a: [\n", "not valid YAML at line 2"),
        ("just a string\n", "expected a PDDeployment object"),
        ("apiVersion: v1\nkind: Pod\n", "expected apiVersion pdmtp.io/v1alpha1"),
        (pdd().prefill(replicas=-1).dict(), "spec.prefill.replicas: Input should be greater"),
        (pdd().decode(replicaz=2).dict(), "spec.decode.replicaz: unknown field"),
        (pdd().decode(tensorParallelSize="four").dict(), "spec.decode.tensorParallelSize"),
        (pdd().set(kvTransfer={"protocol": "ib"}).dict(), "spec.kvTransfer.protocol"),
        ("", "no YAML document"),
    ],
)
def test_unusable_input_exits_2_with_a_clear_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: Any, expected: str
) -> None:
    path = write(tmp_path, content)
    code, out, err = run_cli("validate", path, capsys=capsys)
    assert code == 2
    assert expected in out
    assert "Traceback" not in out + err


def test_missing_file_is_unusable(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run_cli("validate", "-o", "json", str(tmp_path / "nope.yaml"), capsys=capsys)
    assert code == 2 and json.loads(out)["reasons"][0]["reason"] == "InvalidSpec"


def test_validate_exit_code_is_the_worst(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    good = write(tmp_path, pdd().dict(), "good.yaml")
    bad = write(tmp_path, pdd().mtp(3).prefill(k=2).dict(), "bad.yaml")
    assert run_cli("validate", good, bad, capsys=capsys)[0] == 1


def test_render_prints_every_child(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli("render", str(REPO / "samples" / "full.yaml"), capsys=capsys)
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(out))
    assert code == 0
    assert kinds == [
        "Deployment",
        "Deployment",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ]


def test_render_refuses_an_incompatible_spec(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run_cli(
        "render", write(tmp_path, pdd().mtp(3).prefill(k=2).dict()), capsys=capsys
    )
    assert code == 2 and "MTPModulesUnknown" in err


def test_plan_prints_the_paired_roll(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    old = write(tmp_path, pdd().mtp(3, modules=3).prefill(replicas=2).dict(), "old.yaml")
    new = write(tmp_path, pdd().mtp(2, modules=3).prefill(replicas=2).dict(), "new.yaml")
    code, out, _ = run_cli("plan", "--from", old, "--to", new, capsys=capsys)
    assert code == 0
    assert "rollout complete" in out and "invariants 2-5 and 8 held" in out
    assert "unroute" in out and "retire" in out


def test_plan_of_a_role_local_change(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    old = write(tmp_path, pdd().dict(), "old.yaml")
    new = write(
        tmp_path, pdd().decode(replicas=3, resources={"requests": {"cpu": "2"}}).dict(), "new.yaml"
    )
    code, out, _ = run_cli("plan", "--from", old, "--to", new, capsys=capsys)
    assert code == 0
    assert "no paired rollout" in out and "decode roll in place" in out and "decode 1->3" in out


def test_plan_to_an_incompatible_spec_starts_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    old = write(tmp_path, pdd().dict(), "old.yaml")
    new = write(tmp_path, pdd().mtp(3).prefill(k=2).dict(), "new.yaml")
    code, out, _ = run_cli("plan", "--from", old, "--to", new, capsys=capsys)
    assert code == 1 and "no rollout starts" in out


def test_crd_command_and_console_script() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pdmtp.cli", "crd"], capture_output=True, text=True, check=True
    )
    assert yaml.safe_load(done.stdout)["kind"] == "CustomResourceDefinition"


LOADED = """
import contextlib, io, sys
from pdmtp.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(sys.argv[1:])
print(" ".join(sorted(m for m in sys.modules if m.startswith("pdmtp."))))
"""


def loaded_by(*argv: str) -> set[str]:
    """The pdmtp modules a fresh interpreter has loaded after `pdmtp ARGV`."""
    out = subprocess.run(
        [sys.executable, "-c", LOADED, *argv], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


@pytest.mark.parametrize("argv", [("run", "--help"), ("rollout", "--help"), ("--help",)])
def test_the_operator_and_the_cluster_commands_load_no_offline_tooling(
    argv: tuple[str, ...],
) -> None:
    """design.md: the operator never runs the offline tools (`pdmtp.tools`: the YAML reader,
    the simulator), nor the other subcommands."""
    loaded = loaded_by(*argv)
    assert not {m for m in loaded if m.startswith("pdmtp.tools")}, sorted(loaded)
    chosen = {f"pdmtp.cli.{argv[0]}"} if argv[0] != "--help" else set()
    subcommands = {m for m in loaded if m.startswith("pdmtp.cli.")} - {"pdmtp.cli.base"}
    assert subcommands == chosen, sorted(subcommands)


def test_an_offline_command_still_loads_what_it_reads_with() -> None:
    """The other side of the lazy import: `pdmtp validate` gets its reader."""
    assert "pdmtp.tools.yamlread" in loaded_by("validate", "--help")
