"""A real Mooncake transfer (the CPU build of the pinned transfer engine) over TCP on loopback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PAIR = Path(__file__).with_name("mooncake_pair.py")


def loopback_only_namespace() -> list[str]:
    """A command prefix running in a new network namespace with only lo up, if allowed here."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        return []
    prefix = [unshare, "--net", "sh", "-c", f'{ip} link set lo up && exec "$0" "$@"']
    probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
    return prefix if probe.returncode == 0 else []


@pytest.mark.timeout(300)
def test_two_transfer_engines_move_buffers_intact_over_tcp_loopback(tmp_path: Path) -> None:
    result_file = tmp_path / "result.json"
    completed = subprocess.run(
        [*loopback_only_namespace(), sys.executable, str(PAIR), str(result_file)],
        env={**os.environ, "MC_LOG_LEVEL": "WARNING"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    result = json.loads(result_file.read_text())
    assert result["receiver_address"].startswith("127.0.0.1:")
    assert result["write_status"] == 0
    assert result["written_intact"] is True
    assert result["read_status"] == 0
    assert result["blocks_read"] == 32
    assert result["read_back_exact"] is True
