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
def niced_session(script: Path) -> Iterator[int]:
    """A bash script in a session (an autogroup) of its own, niced as hack/with-prebuild.sh nices
    the background builds; yields its PID."""
    if not AUTOGROUP.exists() or not os.access(AUTOGROUP, os.W_OK):
        pytest.skip("no writable autogroup here (CONFIG_SCHED_AUTOGROUP)")
    script.write_text("echo 19 >/proc/self/autogroup && echo ready && sleep 30; true\n")
    proc = subprocess.Popen(["bash", str(script)], start_new_session=True, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def lift(pid: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "hack/lift-prebuild.sh"), "cluster-bins"],
        env={**os.environ, "PDMTP_PREBUILD_PID": str(pid)},
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )


def test_waiting_for_a_background_build_lifts_it_to_normal_priority(tmp_path: Path) -> None:
    with niced_session(tmp_path / "prebuild.sh") as pid:
        assert autogroup_nice(pid) == 19
        result = lift(pid)
        assert autogroup_nice(pid) == 0
        assert "waiting for cluster-bins" in result.stderr


def test_a_pid_that_is_not_the_background_builds_is_left_alone(tmp_path: Path) -> None:
    with niced_session(tmp_path / "other.sh") as pid:
        result = lift(pid)
        assert autogroup_nice(pid) == 19
        assert result.stderr == ""
