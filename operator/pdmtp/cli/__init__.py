"""The `pdmtp` command: offline tools (crd, docs, validate, render, plan), rollout control, the
verdict (verify) and the operator (run). One module a subcommand, holding its options
(`add_arguments`) and its work (`run`), as kubectl keeps one command a file; `base` has what
they all share and `inputs` what the offline ones read.

A subcommand's module is imported only when it is chosen: `pdmtp run` (the operator's entry
point) loads none of the offline tooling (`pdmtp.tools`: the YAML reader, the simulator)."""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol, cast

from pdmtp import __version__
from pdmtp.cli.base import EXIT_UNUSABLE, UnusableInput

COMMANDS: dict[str, str] = {
    "crd": "print a CRD (generated from the model)",
    "docs": "print the PDDeployment field reference (Markdown)",
    "validate": "check PDDeployment files: exit 0 compatible, 1 incompatible, 2 unusable",
    "render": "print the child objects of a PDDeployment",
    "plan": "simulate the rollout from one spec to another",
    "rollout": "rollout control: status, pause, resume, promote, undo, history (kubectl style)",
    "verify": "the verdict on each revision's KV hand-off and MTP acceptance (exit 1: Failed)",
    "run": "run the operator",
}
"""Each subcommand (the module `pdmtp.cli.<name>`) and its one-line help, in the order
`pdmtp --help` lists them."""


class Command(Protocol):
    """A subcommand's module."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def command(name: str) -> Command:
    """The subcommand's module, imported now."""
    return cast(Command, importlib.import_module(f"pdmtp.cli.{name}"))


def chosen(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names: its first word that is not an option (the top level's
    options, --help and --version, take no value)."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None


def build_parser(name: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the options of the subcommand `name`; the others are listed by name and
    help alone, their modules not imported."""
    parser = argparse.ArgumentParser(
        prog="pdmtp",
        description="vLLM prefill/decode serving with MTP on Kubernetes: operator and tools.",
    )
    parser.add_argument("--version", action="version", version=f"pdmtp {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for each, summary in COMMANDS.items():
        sub = subparsers.add_parser(each, help=summary, description=summary)
        if each == name:
            command(each).add_arguments(sub)
    return parser


@functools.cache
def _parser(name: str | None) -> argparse.ArgumentParser:
    # Built once per subcommand: argparse takes ~20 ms to build it (the fuzz calls main).
    return build_parser(name)


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    args = _parser(chosen(words)).parse_args(words)
    try:
        code: int = args.func(args)
    except UnusableInput as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    return code
