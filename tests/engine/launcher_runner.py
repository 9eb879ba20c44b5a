"""Runs the launcher over a batch of scenarios in one fresh process, exec replaced by a recorder.

Invoked by test_launcher.py as `python launcher_runner.py SCENARIOS.json RESULTS.json` (files,
not stdout: vLLM logs to stdout).
A separate process because `create_engine_config` needs a platform with a device type
(VLLM_TARGET_DEVICE=cpu here), and vLLM fixes its platform once per process: the scheduler
tests keep theirs unset, like an engine's scheduler that never touches the device.

scenarios: {"name": {"argv": [...], "env": {...}}, ...}
results:   {"name": {"exit_code": int, "exec": [program, argv] | null,
                    "started": [command, ...], "termination_message": str | null}, ...}
("started": what the launcher would have started beside vLLM, the metrics-only listener;
recorded, never run, as the exec is.)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from pdmtp_engine import launcher


def run_scenario(argv: list[str], env: dict[str, str], scratch: Path) -> dict[str, Any]:
    termination_log = scratch / "termination-log"
    termination_log.unlink(missing_ok=True)
    environ = {**os.environ, **env, launcher.ENV_TERMINATION_LOG: str(termination_log)}
    # Pinned expectations come only from the scenario, never from this process's env.
    for name in (launcher.ENV_ROLE, launcher.ENV_EXPECTED_LOOKAHEAD, launcher.ENV_EXPECTED_BACKOFF):
        if name not in env:
            environ.pop(name, None)
    executed: list[tuple[str, list[str]]] = []
    started: list[list[str]] = []
    exit_code = launcher.main(
        argv,
        environ=environ,
        exec_program=lambda program, args: executed.append((program, args)),
        start_program=started.append,
    )
    return {
        "exit_code": exit_code,
        "exec": list(executed[0]) if executed else None,
        "exec_count": len(executed),
        "started": started,
        "termination_message": (termination_log.read_text() if termination_log.exists() else None),
    }


def main() -> None:
    scenarios_path, results_path = Path(sys.argv[1]), Path(sys.argv[2])
    scenarios: dict[str, dict[str, Any]] = json.loads(scenarios_path.read_text())
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, scenario in scenarios.items():
            results[name] = run_scenario(scenario["argv"], scenario["env"], Path(scratch))
    results_path.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
