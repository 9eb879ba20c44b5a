"""The README's generated blocks: tables whose one source is a table of the API layer.

A block sits between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->` on lines of their
own; `refresh` replaces what is between them with what `BLOCKS[NAME]` renders and leaves every
other line as it is. A file that lacks a registered block's markers, or holds a block no one
registered, is refused rather than half-refreshed.

    python -m pdmtp.tools.readme README.md           rewrite the blocks in place (`make generate`)
    python -m pdmtp.tools.readme --check README.md   exit 1 with a diff on drift (`make verify`)

Pure but for `main`, which reads and writes the file it is given.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable
from pathlib import Path

from pdmtp.api.autoscaling import defaults_markdown
from pdmtp.api.reasons import EVENT, REASONS


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def troubleshooting_markdown() -> str:
    """Symptom -> reason -> what to do, one row per reason that reports a problem (in the
    registry's order), and one row naming the reasons that need nothing."""
    lines = ["| symptom | condition or event: reason | what to do |", "|---|---|---|"]
    quiet: list[str] = []
    for reason in REASONS:
        where = "event" if reason.belongs_to == EVENT else f"`{reason.belongs_to}`"
        if not reason.action:
            quiet.append(f"`{reason.name}`")
            continue
        lines.append(
            f"| {_cell(reason.symptom)} | {where}: `{reason.name}` | {_cell(reason.action)} |"
        )
    lines.append(f"| all is well, or the operator at work | {', '.join(quiet)} | nothing |")
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {
    "autoscaling-defaults": defaults_markdown,
    "troubleshooting": troubleshooting_markdown,
}
"""Each generated block's name and what renders its content."""

_BLOCK = re.compile(
    r"^<!-- generated:(?P<name>[a-z0-9-]+) -->\n(?P<body>.*?)^<!-- /generated:(?P=name) -->$",
    re.M | re.S,
)


def refresh(text: str, blocks: dict[str, Callable[[], str]] = BLOCKS) -> str:
    """`text` with every generated block's content rendered anew."""
    found = [m["name"] for m in _BLOCK.finditer(text)]
    if sorted(found) != sorted(blocks):
        raise ValueError(
            f"generated blocks found {sorted(found)}, registered {sorted(blocks)} "
            "(each registered block exactly once, between its two markers)"
        )

    def rendered(match: re.Match[str]) -> str:
        name = match["name"]
        body = blocks[name]().rstrip("\n")
        return f"<!-- generated:{name} -->\n{body}\n<!-- /generated:{name} -->"

    return _BLOCK.sub(rendered, text)


def update_readme(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdmtp.tools.readme", description=__doc__)
    parser.add_argument("file", type=Path, help="the Markdown file to refresh (README.md)")
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 with a diff if it drifted"
    )
    args = parser.parse_args(argv)
    text = args.file.read_text(encoding="utf-8")
    fresh = refresh(text)
    if not args.check:
        if fresh != text:
            args.file.write_text(fresh, encoding="utf-8")
        return 0
    if fresh == text:
        return 0
    sys.stdout.writelines(
        difflib.unified_diff(
            text.splitlines(keepends=True),
            fresh.splitlines(keepends=True),
            f"{args.file} (committed)",
            f"{args.file} (generated)",
        )
    )
    print(f"{args.file}: generated blocks drifted; run `make generate`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(update_readme())
