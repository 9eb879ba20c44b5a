"""What `make test` prints when a lane fails, and the background builds' priority.

A CI record keeps only the tail of the output, so a failed lane's reason must be repeated there
(hack/lanes.sh); a tier that waits for a niced background build lifts it (hack/lift-prebuild.sh).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_lanes(*lanes: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "hack/lanes.sh"), *lanes],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def tail_after(marker: str, output: str) -> list[str]:
    """The lines after `marker`, up to the next `---- ` line."""
    lines = output.splitlines()
    start = lines.index(marker) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("---- ")), len(lines))
    return lines[start:end]


def test_a_lane_that_fails_outside_its_tests_repeats_its_last_lines() -> None:
    setup = "; ".join(f"echo step {i}" for i in range(40))
    result = run_lanes("kind", f"{setup}; echo 'error: the disk is full' >&2; exit 2", "ok", "true")
    assert result.returncode == 1
    repeated = tail_after("---- lane kind: no test failed; its last lines ----", result.stdout)
    assert repeated[-1] == "error: the disk is full"
    assert len(repeated) == 25
    assert result.stdout.rstrip().splitlines()[-1] == "---- lanes failed: kind ----"


def test_a_lane_whose_tests_failed_repeats_those_tests_only() -> None:
    result = run_lanes(
        "cluster", "echo noise; echo 'FAILED tests/cluster/test_x.py::test_y - boom'; exit 1"
    )
    assert result.returncode == 1
    repeated = tail_after("---- lane cluster: failed tests ----", result.stdout)
    assert repeated == ["FAILED tests/cluster/test_x.py::test_y - boom"]
    assert "its last lines" not in result.stdout


def test_lanes_that_pass_repeat_nothing() -> None:
    result = run_lanes("a", "echo fine", "b", "true")
    assert result.returncode == 0
    assert "failed" not in result.stdout


AUTOGROUP = Path("/proc/self/autogroup")


def autogroup_nice(pid: int) -> int:
    # "/autogroup-42 nice 19"
    return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])


@contextmanager
def niced_session(script: Path, holding: Path | None = None) -> Iterator[int]:
    """A bash script in a session (an autogroup) of its own, niced as hack/with-prebuild.sh nices
    the background builds, holding the lock file `holding` as a build does; yields its PID."""
    if not AUTOGROUP.exists() or not os.access(AUTOGROUP, os.W_OK):
        pytest.skip("no writable autogroup here (CONFIG_SCHED_AUTOGROUP)")
    lock = f"exec 9>{holding} && flock 9 && " if holding else ""
    script.write_text(f"echo 19 >/proc/self/autogroup && {lock}echo ready && sleep 30; true\n")
    proc = subprocess.Popen(["bash", str(script)], start_new_session=True, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def lift(prebuild: int, lock: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "hack/lift-prebuild.sh"), str(lock), "cluster-bins"],
        env={**os.environ, "PDMTP_PREBUILD_PID": str(prebuild)},
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )


def test_waiting_for_a_lock_the_background_builds_hold_lifts_them(tmp_path: Path) -> None:
    lock = tmp_path / "cluster-bins.lock"
    with niced_session(tmp_path / "prebuild.sh", holding=lock) as prebuild:
        assert autogroup_nice(prebuild) == 19
        result = lift(prebuild, lock)
        assert autogroup_nice(prebuild) == 0
        assert "waiting for cluster-bins" in result.stderr


def test_a_lock_another_tier_holds_lifts_nothing(tmp_path: Path) -> None:
    lock = tmp_path / "cluster-bins.lock"
    with (
        niced_session(tmp_path / "prebuild.sh", holding=tmp_path / "keda.lock") as prebuild,
        niced_session(tmp_path / "tier.sh", holding=lock),
    ):
        result = lift(prebuild, lock)
        assert autogroup_nice(prebuild) == 19
        assert result.stderr == ""


def test_a_pid_that_is_not_the_background_builds_is_left_alone(tmp_path: Path) -> None:
    lock = tmp_path / "cluster-bins.lock"
    with niced_session(tmp_path / "other.sh", holding=lock) as pid:
        result = lift(pid, lock)
        assert autogroup_nice(pid) == 19
        assert result.stderr == ""
