"""hack/ is the bottom layer of the tooling: the tests import hack/lib, never the other way round.

A script under hack/ may run the test suites (kind-e2e.sh runs pytest on tests/e2e) and name test
files in its comments, but it must not import test code, put a test directory on a Python path, or
run a test module as a script: that is how tests/support once became the control plane that
`make demo` and `hack/kind-e2e.sh` depend on.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
TESTS = REPO / "tests"

# Shell (and the Python inlined in it): a Python path, sys.path or script run into tests/.
_SHELL_OFFENCES = (
    re.compile(r"tests[/.]support"),
    re.compile(r"sys\.path.*[\"']tests\b"),
    re.compile(r"PYTHONPATH=\S*\btests\b"),
    re.compile(r"(?:python3?|\$\{?PY\}?)\"?\s+(?:-\S+\s+)*tests/\S+\.py\b"),
)


def names_under_tests() -> set[str]:
    """Every top-level name that resolves to code under tests/ on pytest's pythonpath."""
    names = {"tests"}
    for root in (TESTS, TESTS / "support"):
        for entry in root.iterdir():
            if entry.suffix == ".py":
                names.add(entry.stem)
            elif entry.is_dir() and not entry.name.startswith((".", "__")):
                names.add(entry.name)
    return names


def shell_offences(path: str, text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.strip()
        if code.startswith("#"):
            continue  # naming a test file in a comment imports nothing
        if any(pattern.search(code) for pattern in _SHELL_OFFENCES):
            found.append(f"{path}:{number}: {code}")
    return found


def python_offences(path: str, text: str, forbidden: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots = [node.module.split(".")[0]]
        else:
            continue
        found += [f"{path}:{node.lineno}: imports {root}" for root in roots if root in forbidden]
    # A path built into tests/ (sys.path, PYTHONPATH, a script run) is as much an import.
    found += [
        f"{path}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if re.search(r"[\"']tests[\"'/]", line) and not line.strip().startswith("#")
    ]
    return found


def hack_offences() -> list[str]:
    forbidden = names_under_tests()
    found = []
    for path in sorted(p for p in HACK.rglob("*") if p.is_file()):
        name = str(path.relative_to(REPO))
        if "__pycache__" in path.parts:
            continue
        if path.suffix == ".py":
            found += python_offences(name, path.read_text(), forbidden)
        elif path.suffix in (".sh", "") or path.read_bytes().startswith(b"#!"):
            found += shell_offences(name, path.read_text(errors="replace"))
    return found


def test_nothing_under_hack_imports_or_runs_test_code() -> None:
    assert hack_offences() == []


def test_the_guard_catches_what_hack_once_did() -> None:
    """The lines hack/ held before the tooling moved to hack/lib, each caught."""
    demo = "python -c 'import sys; sys.path.insert(0, \"tests/support\"); import localcluster'"
    assert shell_offences("demo.sh", demo)
    assert shell_offences("kind-e2e.sh", "  python3 tests/support/build_images.py names | sed")
    assert shell_offences("x.sh", '"$PY" tests/cluster/gangwatch.py')
    assert shell_offences("x.sh", "PYTHONPATH=tests:operator python -m x")
    snapshot = 'sys.path.insert(0, str(REPO / "tests" / "support"))\nfrom localcluster import X\n'
    assert python_offences("corev1-snapshot.py", snapshot, names_under_tests())
    assert python_offences("x.py", "from cluster.kubehelpers import wait_for\n", {"cluster"})
    assert python_offences("x.py", "import builders\n", names_under_tests())
    # What hack/ may do: run the suites, name test files in comments, import its own library.
    assert not shell_offences("x.sh", '"$PY" -m pytest tests/e2e -q --ignore "$NEEDS_ENGINE"')
    assert not shell_offences("x.sh", "# tests/support/keda.py computes the same key")
    assert not python_offences("x.py", "from loopback import free_ports\n", names_under_tests())


def test_the_moved_tooling_is_not_shadowed_from_tests() -> None:
    """One copy of each: a module left behind in tests/support would win or lose on sys.path by
    the order of pytest's pythonpath."""
    tooling = {p.stem for p in (HACK / "lib").glob("*.py")}
    assert tooling >= {"localcluster", "loopback", "versions", "build_images", "chart"}
    assert not tooling & names_under_tests()
