"""The layering contract (`make lint`, import-linter) holds, and breaks when a layer imports
upward: proven on a copy of the package with one bad import added. docs/design.md draws the same
layers, and every module of the package has its place in them."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

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
        ("cli/render.py", "from pdmtp.cli import plan", "pdmtp.cli.render -> pdmtp.cli.plan"),
        (
            "core/render/children.py",
            "from pdmtp.core.rollout import planner",
            "pdmtp.core.render.children -> pdmtp.core.rollout.planner",
        ),
        (
            "core/objects.py",
            "from pdmtp.core import groups",
            "pdmtp.core.objects -> pdmtp.core.groups",
        ),
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


Layers = list[set[str]]


def contract_layers() -> Layers:
    """The package's layers in the import-linter contract, top first, without `pdmtp.`."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    (contract,) = (
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c["type"] == "layers" and "containers" not in c
    )
    return [
        {m.strip().removeprefix("pdmtp.") for m in layer.split("|")} for layer in contract["layers"]
    ]


def design_layers(design: str) -> Layers:
    """The layer line of docs/design.md: the first code block under "## Layers", `->` between
    layers, `|` between the independent modules of one."""
    section = design.split("\n## Layers\n", 1)[1]
    line = " ".join(section.split("```", 2)[1].split())
    return [{m.strip() for m in layer.split("|")} for layer in line.split("->")]


def drawn(layers: Layers) -> str:
    return " -> ".join(" | ".join(sorted(layer)) for layer in layers)


def test_the_design_draws_the_contracts_layers() -> None:
    design = design_layers((REPO / "docs" / "design.md").read_text())
    contract = contract_layers()
    assert design == contract, f"docs/design.md: {drawn(design)}\npyproject.toml: {drawn(contract)}"


def test_every_module_has_a_layer() -> None:
    package = REPO / "operator" / "pdmtp"
    modules = {
        p.stem
        for p in package.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    placed = set().union(*contract_layers())
    assert modules - placed == set(), "modules in no layer of the contract (pyproject.toml)"
    assert placed - modules == set(), "layers naming no module"


def _code_shape() -> ModuleType:
    spec = importlib.util.spec_from_file_location("code_shape", REPO / "hack" / "code-shape.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_name_has_one_home(tmp_path: Path) -> None:
    """A name defined in two modules sends a reader who greps it to the wrong one (issue 51)."""
    two_homes = _code_shape().two_homes
    assert two_homes(REPO / "operator" / "pdmtp") == {}
    # The check sees a second home: a copy with `Verdict` defined once more, outside verification.
    copy = tmp_path / "pdmtp"
    shutil.copytree(REPO / "operator" / "pdmtp", copy)
    with (copy / "core" / "validation.py").open("a") as f:
        f.write("\n\nclass Verdict:\n    pass\n")
    assert two_homes(copy) == {"Verdict": ["core/validation.py", "core/verification/verdict.py"]}
