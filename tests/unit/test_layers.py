"""The layering contract (`make lint`, import-linter) holds, and breaks when a layer imports
upward: proven on a copy of the package with one bad import added."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint(package_root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tree_keeps_its_layers() -> None:
    done = lint(REPO / "operator")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("module", "bad_import", "expected"),
    [
        ("api/methods.py", "from pdmtp.core import hashing", "pdmtp.api.methods -> pdmtp.core"),
        ("core/names.py", "import pdmtp.kube", "pdmtp.core.names -> pdmtp.kube"),
        ("kube.py", "import pdmtp.controller", "pdmtp.kube -> pdmtp.controller"),
        ("core/hashing.py", "import kopf", "pdmtp.core.hashing -> kopf"),
    ],
)
def test_an_upward_import_breaks_the_contract(
    tmp_path: Path, module: str, bad_import: str, expected: str
) -> None:
    shutil.copytree(REPO / "operator" / "pdmtp", tmp_path / "pdmtp")
    with (tmp_path / "pdmtp" / module).open("a") as f:
        f.write(f"\n{bad_import}  # noqa\n")
    done = lint(tmp_path)
    assert done.returncode == 1, done.stdout
    assert expected in done.stdout
