"""`pdmtp crd`: a CRD as generated from the pydantic models."""

from __future__ import annotations

import argparse

from pdmtp.api import vocabulary as v
from pdmtp.api.crd import crd_yaml


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kind",
        choices=[v.KIND, v.ROLE_SCALE_KIND],
        default=v.KIND,
        help="PDDeployment (default) or PDRoleScale (an External-autoscaled role's /scale)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(crd_yaml(args.kind), end="")
    return 0
