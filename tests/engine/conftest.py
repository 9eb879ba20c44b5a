"""Engine tier: real vLLM (the pinned version) and the Mooncake transfer engine, on CPU.

Run it with the engine venv's interpreter (hack/engine-venv.sh prints its path):

    ENGINE_VENV=$(hack/engine-venv.sh)
    $ENGINE_VENV/bin/python -m pytest tests/engine -p no:cacheprovider

Outside that venv the tier is skipped, or fails when PDMTP_REQUIRE_ALL=1.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_PACKAGE_DIR = REPO_ROOT / "images" / "engine"
OPERATOR_PACKAGE_DIR = REPO_ROOT / "operator"
TESTS_DIR = Path(__file__).resolve().parent
TOOLS_DIR = REPO_ROOT / "hack" / "lib"

# The tests import pdmtp_engine and the operator's pure pdmtp.core from the work tree, and
# subprocesses (the launcher, vLLM's connector loading) must find them too; the pins come from
# hack/lib/versions.py.
for path in (ENGINE_PACKAGE_DIR, OPERATOR_PACKAGE_DIR, TESTS_DIR, TOOLS_DIR):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ENGINE_PACKAGE_DIR), str(OPERATOR_PACKAGE_DIR)]
    + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)
# Never reach the Hugging Face hub: every model here is a local config.json the tests write.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

MISSING_ENGINE_MODULES = [
    name for name in ("vllm", "mooncake") if importlib.util.find_spec(name) is None
]

if MISSING_ENGINE_MODULES:
    # Nothing here can even be imported: skip the tier (or fail it, see pytest_configure).
    collect_ignore_glob = ["test_*.py"]


@pytest.hookimpl(tryfirst=True)  # before pytest's tmp_path factory reads the basetemp
def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None:
        # A basetemp of this session's own: pytest's shared one is rotated (three kept) by every
        # other session on the machine, and a fixed one is wiped by the next session that names
        # it (seen: a second engine session beside `make test` broke 20 of its tests).
        config.option.basetemp = tempfile.mkdtemp(prefix="pdmtp-engine-")
    config.addinivalue_line(
        "markers", "engine: needs the engine venv (real vLLM on CPU, mooncake-transfer-engine)"
    )
    if MISSING_ENGINE_MODULES and os.environ.get("PDMTP_REQUIRE_ALL") == "1":
        raise pytest.UsageError(
            f"engine tier: {', '.join(MISSING_ENGINE_MODULES)} not importable by {sys.executable}; "
            "run it with the venv from hack/engine-venv.sh (PDMTP_REQUIRE_ALL=1 forbids skipping)"
        )


def pytest_report_header(config: pytest.Config) -> str:
    if MISSING_ENGINE_MODULES:
        return f"engine tier SKIPPED: {', '.join(MISSING_ENGINE_MODULES)} missing"
    return f"engine tier: {sys.executable}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(TESTS_DIR):
            item.add_marker(pytest.mark.engine)
