"""Print the operator's shape: lines per package and its longest functions.

Issue 42 asks for these before and after a refactor; run it on any checkout:
    python hack/code-shape.py [ROOT]   (ROOT defaults to operator/pdmtp)
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
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


if __name__ == "__main__":
    main()
