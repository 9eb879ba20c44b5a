"""`pdmtp docs`: the PDDeployment field reference, generated from the models (Markdown)."""

from __future__ import annotations

import argparse

from pdmtp.cli.inputs import Subparsers
from pdmtp.tools.reference import field_reference


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser("docs", help="print the PDDeployment field reference (Markdown)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(field_reference(), end="")
    return 0
