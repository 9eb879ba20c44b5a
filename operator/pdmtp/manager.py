"""The operator process, what controller-runtime calls the manager: kopf runs it (login,
start-up and clean-up, the admission webhook) around the controller (`pdmtp.controller`), with
the HTTP endpoints (health and metrics) and leader election beside it. kopf watches nothing for
pdmtp: its resources are resolved from API discovery once and on CRD events, which can miss a
CRD created just after it starts, whereas the controller's reflectors keep listing until the API
server serves the PDDeployments.
"""

from __future__ import annotations

import asyncio
import logging
import platform
from importlib.metadata import version
from typing import Any

import kopf

from pdmtp import __version__
from pdmtp.api import vocabulary as v
from pdmtp.backoff import backoff
from pdmtp.controller import Controller, Options
from pdmtp.core.validation import validate
from pdmtp.election import ElectionOptions, Elector, Fence, unelected
from pdmtp.endpoints import app as endpoints_app
from pdmtp.endpoints import serve as serve_endpoints
from pdmtp.kopfcompat import Insights, resolves
from pdmtp.kube import Kube
from pdmtp.metrics import Metrics
from pdmtp.probe import HttpTarget, ProbeTarget
from pdmtp.scrape import HttpSource, MetricsSource
from pdmtp.webhook import MANAGED_CONFIGURATION, WebhookOptions, server

log = logging.getLogger("pdmtp")

KOPF_BACKOFFS = tuple(backoff(attempt, 1.0, 30.0, jitter=0) for attempt in range(13))
"""kopf's own retries (discovery, its CRD and namespace watches), on the operator's one backoff:
1 s doubling to 30 s, ~4.5 minutes in all, longer than an API server restart."""


def connection_info(cfg: Any) -> kopf.ConnectionInfo:
    """kopf credentials from a kubernetes-client Configuration."""
    token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    scheme = None
    if token:
        scheme, _, token = token.partition(" ") if " " in token else ("Bearer", "", token)
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        scheme=scheme,
        token=token or None,
    )


def build_registry(
    controller: Controller, webhook: WebhookOptions | None = None
) -> kopf.OperatorRegistry:
    """kopf handlers of the operator, in a registry of their own (no module-level state)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        # kopf talks to the API with the same identity as the reconciler (--kubeconfig or
        # in-cluster), not with whatever its own discovery would find.
        return connection_info(controller.kube.api.configuration)

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # No persistence settings: kopf handles no resource changes for pdmtp, so it keeps no
        # progress or diff-base on any object.
        settings.posting.enabled = False  # our own events only, not every log line
        settings.peering.standalone = True
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        # kopf gives up (and with it the process) once these run out.
        settings.networking.error_backoffs = KOPF_BACKOFFS
        await controller.start()
        if webhook is not None:
            if controller.elector is not None:
                # One admission server at a time, the leader's: the managed configuration
                # carries its address and certificate. A standby keeps its caches warm here
                # and serves no review until it leads (kopf starts the server after this).
                await controller.elector.leading.wait()
            settings.admission.server = server(webhook)
            if webhook.manage:
                settings.admission.managed = MANAGED_CONFIGURATION

    @kopf.on.cleanup(registry=registry)
    async def stop(**_: Any) -> None:
        await controller.stop()
        if controller.elector is not None:
            # Handed back now, not after kopf's own shutdown: a standby takes over at its
            # next look instead of after a whole lease.
            await asyncio.to_thread(controller.elector.release)

    if webhook is not None:
        from pdmtp import admission  # the webhook's dry runs; only when it is served

        # failurePolicy Ignore: an operator that is down must not block every apply; the CRD's
        # CEL rules and the operator's own check remain.
        @kopf.on.validate(
            v.GROUP,
            v.VERSION,
            v.PLURAL,
            id="agreement",
            ignore_failures=True,
            operations=["CREATE", "UPDATE"],
            registry=registry,
        )
        def admit(body: kopf.Body, namespace: str | None = None, **_: Any) -> None:
            # The offline verdict, then the rendered children dry-run on the API server: a spec
            # whose Deployments would be refused is refused here, in the server's words.
            ns = body.get("metadata", {}).get("namespace") or namespace or "default"
            try:
                problems = admission.review(controller.kube.api, body, ns)
            except Exception as e:  # the dry run itself failed (an API error, a timeout)
                log.warning("Dry run of the children failed, admitting on the offline check: %s", e)
                problems = list(validate(body).problems)
            if problems:
                raise kopf.AdmissionError("; ".join(p.line() for p in problems), code=422)

    return registry


async def _serve(
    controller: Controller,
    registry: kopf.OperatorRegistry,
    health: tuple[str, int] | None,
    metrics: tuple[str, int] | None,
    webhook: WebhookOptions | None,
) -> None:
    options = controller.options
    # kopf takes an Insights of ours so its discovery state can be read.
    insights = Insights()
    if webhook is not None:
        controller.webhook_resolved = resolves(insights, v.GROUP, v.PLURAL)
    listens = [at for at in (health, metrics) if at is not None]
    runner = None
    if listens:
        exposition = None if metrics is None else controller.metrics.exposition
        runner = await serve_endpoints(endpoints_app(controller.health, exposition), listens)
    stop = asyncio.Event()
    elector = controller.elector
    election = None
    if elector is not None:
        # Lost: kopf stops (its clean-up stops the controller) and the process exits.
        election = asyncio.create_task(_elect(elector, stop), name="pdmtp-election")
    try:
        await kopf.operator(
            registry=registry,
            insights=insights,
            namespaces=list(options.namespaces),
            clusterwide=not options.namespaces,
            standalone=True,
            stop_flag=stop,
        )
    finally:
        if election is not None:
            election.cancel()
            await asyncio.gather(election, return_exceptions=True)
        if elector is not None and not elector.lost.is_set():
            await asyncio.to_thread(elector.release)  # a clean stop: a standby takes over now
        if runner is not None:
            await runner.cleanup()


async def _elect(elector: Elector, stop: asyncio.Event) -> None:
    await elector.run()
    stop.set()


LOST_LEASE_EXIT = 3
"""The exit status of a leader that lost its Lease (Kubernetes starts it again as a standby)."""


def run_operator(
    kube: Kube,
    options: Options,
    metrics: Metrics,
    health: tuple[str, int] | None = None,
    webhook: WebhookOptions | None = None,
    source: MetricsSource | None = None,
    metrics_at: tuple[str, int] | None = None,
    election: ElectionOptions | None = None,
    probes: ProbeTarget | None = None,
) -> int:
    """Run the operator until interrupted, or until it loses the leader Lease (`election`;
    None: no election, it always leads); returns the exit status. `health` is where /healthz
    and /readyz listen, `metrics_at` where /metrics does (None: nowhere), `source` where the
    autoscaler reads the engines' metrics (their pods, by default), `probes` where the
    verdict's probe requests go (the routers, by default)."""
    controller = Controller(
        kube, options, metrics, source=source or HttpSource(), probes=probes or HttpTarget()
    )
    fence = unelected() if election is None else Fence(metrics.fenced_writes.inc)
    kube.fence = fence.check
    identity = "" if election is None else election.identity
    metrics.leader.labels(identity).set(1 if election is None else 0)
    if election is not None:

        def on_change(leading: bool) -> None:
            metrics.leader.labels(identity).set(1 if leading else 0)

        controller.elector = Elector(kube, election, fence, on_change)
    registry = build_registry(controller, webhook)
    kopf.configure(verbose=False, debug=log.isEnabledFor(logging.DEBUG))
    # The first line of every operator log: which build is running, and what it watches.
    scope = ", ".join(options.namespaces) or "all namespaces"
    log.info(
        "pdmtp %s starting (kopf %s, Python %s), watching %s",
        __version__,
        version("kopf"),
        platform.python_version(),
        scope,
    )
    if election is not None:
        t = election.timing
        log.info(
            "Leader election on Lease %s/%s as %s (lease %gs, renew deadline %gs, retry %gs)",
            election.namespace,
            election.name,
            election.identity,
            t.lease_seconds,
            t.renew_deadline_seconds,
            t.retry_seconds,
        )
    asyncio.run(_serve(controller, registry, health, metrics_at, webhook))
    lost = controller.elector is not None and controller.elector.lost.is_set()
    return LOST_LEASE_EXIT if lost else 0
