"""`pdmtp run`: the operator (what the image's entry point runs), its flags turned into the
options of `pdmtp.manager.run_operator`."""

from __future__ import annotations

import argparse
import logging

from pdmtp import __version__
from pdmtp.cli.base import UnusableInput, connect


def add_arguments(p: argparse.ArgumentParser) -> None:
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", help="watch this namespace (repeat)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    p.add_argument("--kubeconfig", help="default: in-cluster, then $KUBECONFIG")
    p.add_argument(
        "--resync-seconds",
        type=float,
        default=30.0,
        help="re-reconcile every PDDeployment this often (pod churn, drains)",
    )
    p.add_argument("--workers", type=int, default=4, help="PDDeployments reconciled at once")
    p.add_argument("--metrics-port", type=int, default=9090, help="0 turns metrics off")
    p.add_argument("--metrics-address", default="0.0.0.0")
    p.add_argument(
        "--health-listen",
        metavar="ADDR:PORT",
        default="0.0.0.0:8081",
        help=(
            "serve /healthz (liveness) and /readyz (readiness) here (empty: none); the same "
            "server answers on the metrics port, and this one serves /metrics too"
        ),
    )
    p.add_argument(
        "--metrics-source",
        metavar="http|dir:PATH",
        help=(
            "where the autoscaler and the verdict read the engines' metrics: http (default) "
            "scrapes each engine "
            "pod's metrics-only port; dir:PATH reads PATH/<namespace>/<pod>.prom (tests whose "
            "pod IPs are fake)"
        ),
    )
    p.add_argument(
        "--probe-target",
        metavar="http|dir:PATH",
        help=(
            "where the verdict's probe requests go (spec.verification.probeRequestsPerMinute): "
            "http sends them through each revision's router pod; dir:PATH appends them to "
            "PATH/<namespace>/<name>.probes (tests whose pod IPs are fake). Default: the kind "
            "of --metrics-source"
        ),
    )
    p.add_argument(
        "--verification-interval-seconds",
        type=float,
        default=15.0,
        help="scrape each PDDeployment's engines this often for its verdict (spec.verification)",
    )
    p.add_argument(
        "--unwatched-grace-seconds",
        type=float,
        help="report not live once PDDeployments have gone unwatched this long (default 120)",
    )
    p.add_argument(
        "--webhook-listen",
        metavar="ADDR:PORT",
        help="serve the validating admission webhook here (off by default)",
    )
    p.add_argument("--webhook-host", help="name the API server dials (default: ADDR)")
    p.add_argument(
        "--webhook-manage",
        action="store_true",
        help="create/update the ValidatingWebhookConfiguration (needs RBAC for it)",
    )
    election = p.add_argument_group("leader election (run several replicas, one reconciles)")
    election.add_argument(
        "--leader-elect",
        action="store_true",
        help="reconcile only while holding a coordination.k8s.io Lease; stand by otherwise",
    )
    election.add_argument(
        "--leader-election-namespace",
        metavar="NS",
        help="the Lease's namespace (default: $POD_NAMESPACE, then the pod's own)",
    )
    election.add_argument("--leader-election-id", default="pdmtp-operator", help="the Lease's name")
    election.add_argument(
        "--leader-election-identity",
        metavar="ID",
        help="this candidate's name in the Lease (default: $POD_NAME or the host, and a suffix)",
    )
    election.add_argument("--lease-seconds", type=float, default=15.0, metavar="S")
    election.add_argument("--renew-deadline-seconds", type=float, default=10.0, metavar="S")
    election.add_argument("--retry-seconds", type=float, default=2.0, metavar="S")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: the offline commands must not need a cluster client or kopf.
    from pdmtp.controller import Options
    from pdmtp.core.leadership import Timing
    from pdmtp.election import ElectionOptions, default_identity, default_namespace
    from pdmtp.health import GRACE_SECONDS
    from pdmtp.kube import Kube
    from pdmtp.manager import run_operator
    from pdmtp.metrics import Metrics
    from pdmtp.probe import target_from
    from pdmtp.scrape import source_from
    from pdmtp.webhook import WebhookOptions

    # kopf installs the log handler (pdmtp.manager.run_operator): one format, one line per record.
    logging.getLogger("pdmtp").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    # Every liveness probe and metrics scrape would be an INFO line otherwise.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    namespaces = () if args.all_namespaces else tuple(args.namespace or ["default"])
    metrics = Metrics()
    metrics_at = (args.metrics_address, args.metrics_port) if args.metrics_port else None
    options = Options(
        namespaces=namespaces,
        resync_seconds=args.resync_seconds,
        workers=args.workers,
        grace_seconds=args.unwatched_grace_seconds or GRACE_SECONDS,
        verification_seconds=args.verification_interval_seconds,
    )
    try:
        source = source_from(args.metrics_source)
        probes = target_from(args.probe_target or args.metrics_source)
    except ValueError as e:
        raise UnusableInput(str(e)) from e
    api = connect(args.kubeconfig)
    election = None
    if args.leader_elect:
        lease_namespace = args.leader_election_namespace or default_namespace()
        if not lease_namespace:
            raise UnusableInput(
                "--leader-elect: no namespace for the Lease (not in a pod, no $POD_NAMESPACE): "
                "give --leader-election-namespace"
            )
        try:
            timing = Timing(args.lease_seconds, args.renew_deadline_seconds, args.retry_seconds)
        except ValueError as e:
            raise UnusableInput(str(e)) from e
        election = ElectionOptions(
            namespace=lease_namespace,
            name=args.leader_election_id,
            identity=args.leader_election_identity or default_identity(),
            timing=timing,
        )
    # The identity in every request's User-Agent: an audit log tells the replicas apart.
    api.user_agent = f"pdmtp/{__version__}" + (f" ({election.identity})" if election else "")
    kube = Kube(api, on_request=lambda verb: metrics.api_requests.labels(verb).inc())
    webhook = None
    if args.webhook_listen:
        addr, _, port = args.webhook_listen.rpartition(":")
        webhook = WebhookOptions(
            addr=addr, port=int(port), host=args.webhook_host or addr, manage=args.webhook_manage
        )
    health = None
    if args.health_listen:
        addr, _, port = args.health_listen.rpartition(":")
        health = (addr, int(port))
    return run_operator(
        kube,
        options,
        metrics,
        health=health,
        metrics_at=metrics_at,
        webhook=webhook,
        source=source,
        election=election,
        probes=probes,
    )
