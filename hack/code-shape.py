"""Print the operator's shape: lines per package, its longest functions, and the public names
defined in more than one module (a reader who greps one lands in the wrong place).

Issues 42 and 51 ask for these before and after a refactor; run it on any checkout:
    python hack/code-shape.py [ROOT]   (ROOT defaults to operator/pdmtp)
"""

from __future__ import annotations

import ast
import sys
from collections import Counter, defaultdict
from pathlib import Path


def package_lines(root: Path) -> Counter[str]:
    lines: Counter[str] = Counter()
    for path in sorted(root.rglob("*.py")):
        package = ".".join(("pdmtp", *path.relative_to(root).parent.parts))
        lines[package] += len(path.read_text().splitlines())
    return lines


def longest_functions(root: Path, count: int) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append((length, f"{path.relative_to(root.parent)}:{node.name}"))
    return sorted(found, reverse=True)[:count]


# Names every module of a kind defines by design: a module's logger, and the two functions that
# make a module a `pdmtp` subcommand (pdmtp.cli loads them by name).
_PER_MODULE = {"log"}
_SUBCOMMAND = {"add_arguments", "run"}


def _top_level_names(tree: ast.Module) -> list[str]:
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    # Constants (UPPER_CASE) are a module's own settings; private names are its own business.
    return [n for n in names if not n.startswith("_") and not n.isupper()]


def two_homes(root: Path) -> dict[str, list[str]]:
    """Public classes, functions and aliases defined at the top of more than one module."""
    homes: defaultdict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        module = str(path.relative_to(root))
        subcommand = path.parent.name == "cli"
        for name in _top_level_names(ast.parse(path.read_text())):
            if name in _PER_MODULE or (subcommand and name in _SUBCOMMAND):
                continue
            homes[name].append(module)
    return {name: found for name, found in sorted(homes.items()) if len(found) > 1}


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "operator/pdmtp")
    lines = package_lines(root)
    print("| package | modules | lines |\n|---|---:|---:|")
    modules = Counter(
        ".".join(("pdmtp", *p.relative_to(root).parent.parts)) for p in root.rglob("*.py")
    )
    for package in sorted(lines):
        print(f"| {package} | {modules[package]} | {lines[package]} |")
    print(f"| total | {sum(modules.values())} | {sum(lines.values())} |\n")
    print("| function | lines |\n|---|---:|")
    for length, name in longest_functions(root, 5):
        print(f"| {name} | {length} |")
    shared = two_homes(root)
    print(f"\npublic names with two homes: {len(shared)}")
    for name, found in shared.items():
        print(f"- {name}: {', '.join(found)}")


if __name__ == "__main__":
    main()
