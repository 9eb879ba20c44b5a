"""`pdmtp verify NAME` (also `kubectl pdmtp verify`): per revision, the requests whose KV the
decodes pulled, the tokens pulled and recomputed, the failures, the acceptance and the verdict;
exit 0 when the update revision is Verified, 1 when it Failed, 3 while it is Pending."""

from __future__ import annotations

import argparse
import sys

from pdmtp.cli.base import EXIT_INCOMPATIBLE, connect


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="the PDDeployment")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG, then ~/.kube/config")
    p.add_argument(
        "--timeout",
        type=float,
        default=0,
        help="wait this many seconds for the update revision to be Verified or Failed",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: the offline commands must not need a cluster client.
    from pdmtp import rolloutctl, verifyctl
    from pdmtp.kube import Kube

    try:
        return verifyctl.verify(
            Kube(connect(args.kubeconfig)), args.namespace, args.name, args.timeout
        )
    except rolloutctl.RolloutError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INCOMPATIBLE
