"""Every command README.md shows is under a test, or says why it cannot be (issue 33).

The registry is tests/unit/readme_commands.py; docs/readme-commands.md is its table. A command
added to the README without an entry fails here, and so does an entry whose command the README no
longer shows, a node id naming a test that does not exist, or a `make test` step the Makefile no
longer runs."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest
from unit.readme_commands import (
    REGISTRY,
    REPO,
    ByMake,
    Run,
    extract,
    normalise,
    readme_commands,
    table,
)


@cache
def functions_of(path: Path) -> frozenset[str]:
    """`test_x` and `TestY::test_x` for every test function of a file (by parsing, not import)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {
                f"{node.name}::{f.name}"
                for f in node.body
                if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            }
    return frozenset(n for n in names if n.split("::")[-1].startswith("test_"))


def missing_tests(node_ids: list[str]) -> list[str]:
    """The node ids that name no file or no test function in it (parameters ignored)."""
    missing = []
    for node_id in node_ids:
        path, _, name = node_id.partition("::")
        file = REPO / path
        if not file.is_file() or name.split("[")[0] not in functions_of(file):
            missing.append(node_id)
    return missing


def test_every_readme_command_is_in_the_registry() -> None:
    unregistered = [c for c in readme_commands() if c not in REGISTRY]
    assert not unregistered, (
        "README commands without a test (add each to tests/unit/readme_commands.py with the "
        f"test that runs it, or why none can, then regenerate the docs table): {unregistered}"
    )


def test_every_registered_command_is_still_in_the_readme() -> None:
    shown = set(readme_commands())
    stale = [c for c in REGISTRY if c not in shown]
    assert not stale, f"registry entries the README no longer shows: {stale}"


def test_every_registered_test_exists() -> None:
    node_ids = [t for e in REGISTRY.values() if isinstance(e, Run) for t in e.tests]
    assert len(node_ids) > 50
    assert not (missing := missing_tests(node_ids)), f"no such test: {missing}"


def make_test_targets() -> set[str]:
    """The targets `make test` runs: its recipe's `$(MAKE)` targets, theirs in turn (test-lanes
    runs three lanes of them), and the prerequisites of each."""
    lines = (REPO / "Makefile").read_text(encoding="utf-8").splitlines()
    rules: dict[str, list[str]] = {}
    recipes: dict[str, list[str]] = {}
    for line in lines:
        if m := re.match(r"^([\w-]+):(.*)", line):
            target = m[1]
            rules[target] = m[2].split("##")[0].split()
            recipes[target] = []
        elif line.startswith("\t") and rules:
            recipes[target].append(line)
    found: set[str] = set()
    pending = ["test"]
    while pending:
        step_of = pending.pop()
        made = {
            word.strip("'\"")
            for line in recipes.get(step_of, [])
            for part in line.split("$(MAKE)")[1:]
            for word in part.split()
        }
        for step in (made | set(rules.get(step_of, []))) & rules.keys() - found:
            found.add(step)
            pending.append(step)
    return found


def test_every_make_test_step_is_still_there() -> None:
    targets = make_test_targets()
    assert {"lint", "test-unit", "kind-e2e"} <= targets
    for command, entry in REGISTRY.items():
        if isinstance(entry, ByMake):
            path, text = entry.evidence
            if path == "Makefile":
                assert text in targets, (command, "`make test` no longer runs", text)
            else:
                assert text in (REPO / path).read_text(encoding="utf-8"), (command, entry.evidence)


def test_the_committed_table_is_generated() -> None:
    committed = (REPO / "docs" / "readme-commands.md").read_text(encoding="utf-8")
    assert committed == table(), (
        "run: .venv/bin/python tests/unit/readme_commands.py > docs/readme-commands.md"
    )


# ---- the checks themselves fail when they should


def test_a_missing_test_is_found() -> None:
    assert missing_tests(
        [
            "tests/unit/test_readme_commands.py::test_every_registered_test_exists",
            "tests/unit/test_readme_commands.py::test_no_such_test",
            "tests/unit/no_such_file.py::test_x",
            "tests/cluster/test_crd_admission.py::test_samples_are_accepted[full.yaml]",
        ]
    ) == [
        "tests/unit/test_readme_commands.py::test_no_such_test",
        "tests/unit/no_such_file.py::test_x",
    ]


def test_extraction_finds_fenced_console_and_inline_commands() -> None:
    text = "\n".join(
        [
            "Run `make demo`, then `pdmtp rollout status NAME [--timeout S]`;",
            "see `hack/x/README.md`",
            "and `pdmtp-operator`, `pdmtp 0.2.0 starting`, `make`.",
            "```sh",
            "# a comment",
            "docker build --build-arg A \\",
            "  -t $REG/x:1 .      # trailing",
            "kubectl get pdd -o jsonpath='{.a#b}'",
            "```",
            "```console",
            "$ kubectl get pdd",
            "NAME  READY",
            "```",
            "```yaml",
            "spec: {}",
            "```",
        ]
    )
    assert extract(text) == [
        "make demo",
        "pdmtp rollout status <NAME> [--timeout <S>]",
        "docker build --build-arg A -t <REG>/x:1 .",
        "kubectl get pdd -o jsonpath='{.a#b}'",
        "kubectl get pdd",
    ]
    assert normalise("pdmtp run --webhook-listen ADDR:PORT") == (
        "pdmtp run --webhook-listen <ADDR>:<PORT>"
    )


@pytest.mark.parametrize("extra", ["`pdmtp frobnicate FILE`", "```sh\nkubectl get frobs\n```"])
def test_a_new_readme_command_without_a_test_is_caught(extra: str) -> None:
    shown = extract((REPO / "README.md").read_text(encoding="utf-8") + "\n" + extra + "\n")
    assert [c for c in shown if c not in REGISTRY] in (
        ["pdmtp frobnicate <FILE>"],
        ["kubectl get frobs"],
    )
