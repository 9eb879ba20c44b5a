"""`pdmtp rollout` (also `kubectl pdmtp rollout`): status, pause, resume, promote, undo and
history of a PDDeployment's rollout, as `kubectl rollout` offers them for a Deployment."""

from __future__ import annotations

import argparse
import sys

from pdmtp.cli.base import EXIT_INCOMPATIBLE, connect


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("status", "pause", "resume", "promote", "undo", "history"))
    p.add_argument("name", metavar="NAME", help="the PDDeployment")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG, then ~/.kube/config")
    p.add_argument(
        "--timeout", type=float, default=0, help="status: give up after this many seconds (0: wait)"
    )
    p.add_argument("--to-revision", type=int, help="undo: the recorded revision number")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: the offline commands must not need a cluster client.
    from pdmtp import rolloutctl
    from pdmtp.kube import Kube

    api = Kube(connect(args.kubeconfig))
    ns, name = args.namespace, args.name
    try:
        if args.action == "status":
            return rolloutctl.status(api, ns, name, args.timeout)
        if args.action in ("pause", "resume"):
            print(rolloutctl.pause(api, ns, name, paused=args.action == "pause"))
        elif args.action == "promote":
            print(rolloutctl.promote(api, ns, name))
        elif args.action == "undo":
            print(rolloutctl.undo(api, ns, name, args.to_revision))
        elif args.action == "history":
            print(rolloutctl.format_history(rolloutctl.history(api, ns, name)))
    except rolloutctl.RolloutError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INCOMPATIBLE
    return 0
