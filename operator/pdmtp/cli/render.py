"""`pdmtp render`: the children a PDDeployment has once rolled out, as YAML or a JSON List."""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml

from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.cli.base import UnusableInput
from pdmtp.cli.inputs import load_one
from pdmtp.core.agreement import check
from pdmtp.core.render.children import RevisionReplicas, revision_children, shared_children
from pdmtp.core.rollout.steering import target_and_policy


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE")
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    p.add_argument("-n", "--namespace", default="default", help="when the file names none")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    pdd = load_one(args.file)
    if pdd.metadata.namespace is None:
        pdd = pdd.model_copy(
            update={"metadata": pdd.metadata.model_copy(update={"namespace": args.namespace})}
        )
    children = rendered_children(pdd)
    if args.output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": children}, indent=2))
    else:
        print(yaml.safe_dump_all(children, sort_keys=False), end="")
    return 0


def rendered_children(pdd: PDDeployment) -> list[dict[str, Any]]:
    """The children of a PDDeployment once rolled out (router args come from live pods)."""
    agreement = check(pdd.spec)
    if not agreement.compatible:
        raise UnusableInput(
            "incompatible spec, nothing to render: "
            + "; ".join(f"{f.reason}: {f.message}" for f in agreement.findings)
        )
    target, _ = target_and_policy(agreement)
    assert target.revision is not None
    replicas = RevisionReplicas(target.prefill, target.decode, target.router)
    return [
        *shared_children(pdd, agreement.settings),
        *revision_children(pdd, target.revision, replicas, agreement, None),
    ]
