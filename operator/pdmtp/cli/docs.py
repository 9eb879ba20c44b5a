"""`pdmtp docs`: the PDDeployment field reference, generated from the models (Markdown)."""

from __future__ import annotations

import argparse

from pdmtp.tools.reference import field_reference


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(field_reference(), end="")
    return 0
