"""The `pdmtp` command: offline tools (crd, docs, validate, render, plan), rollout control, the
verdict (verify) and the operator (run). One module a subcommand, holding its options
(`add_parser`) and its work (`run`), as kubectl keeps one command a file; `inputs` has what they
read and share."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from typing import Protocol

from pdmtp import __version__
from pdmtp.cli import crd, docs, plan, render, rollout, run, validate, verify
from pdmtp.cli.inputs import EXIT_UNUSABLE, Subparsers, UnusableInput


class Command(Protocol):
    """A subcommand's module."""

    def add_parser(self, subparsers: Subparsers) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


COMMANDS: tuple[Command, ...] = (crd, docs, validate, render, plan, rollout, verify, run)
"""In the order `pdmtp --help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdmtp",
        description="vLLM prefill/decode serving with MTP on Kubernetes: operator and tools.",
    )
    parser.add_argument("--version", action="version", version=f"pdmtp {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()  # built once: argparse takes ~20 ms to build it (the fuzz calls main)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except UnusableInput as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    return code
