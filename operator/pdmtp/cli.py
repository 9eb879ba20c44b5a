"""The `pdmtp` command: offline tools (crd, validate, render, plan) and the operator (run)."""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pdmtp import __version__, yamlread
from pdmtp.api import crd, reasons
from pdmtp.api import vocabulary as v
from pdmtp.api.crd import crd_yaml
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.api.vocabulary import ROLES
from pdmtp.core.agreement import Agreement, check
from pdmtp.core.invariants import InvariantMonitor
from pdmtp.core.planner import Policy, Step, Target
from pdmtp.core.render import RevisionReplicas, revision_children, shared_children
from pdmtp.core.revision import revision_of, role_hash, target_and_policy
from pdmtp.core.validation import Problem, field_problems, validate
from pdmtp.simulate import InvariantViolation, SimCluster, Trace, run

EXIT_COMPATIBLE = 0
EXIT_INCOMPATIBLE = 1
EXIT_UNUSABLE = 2
INVALID = reasons.INVALID_SPEC


class UnusableInput(Exception):
    """The input cannot be read as a PDDeployment; the message names the file and field."""


def load_documents(path: str) -> list[Any]:
    """The objects of a file ('-' is standard input) as kubectl would send them
    (pdmtp.yamlread: the same YAML and JSON reading, a `List`'s items one by one)."""
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as e:
        raise UnusableInput(f"{path}: cannot read: {e.strerror}") from e
    if b"\x00" in raw:
        raise UnusableInput(f"{path}: contains NUL bytes: not a YAML file")
    warnings: list[str] = []
    try:
        docs = yamlread.read_bytes(raw, warnings)
    except yamlread.ReadError as e:
        where = "" if e.line is None else f" at line {e.line}"
        raise UnusableInput(f"{path}: not valid YAML{where}: {e.message}") from e
    for warning in warnings:  # kubectl sends the last value without a word; so do we, with one
        print(f"warning: {path}: {warning}", file=sys.stderr)
    if not docs:
        raise UnusableInput(f"{path}: no YAML document in the file")
    return docs


def parse(doc: Any, source: str) -> PDDeployment:
    """A PDDeployment from one YAML document, or UnusableInput naming every bad field."""
    if not isinstance(doc, dict):
        raise UnusableInput(f"{source}: expected a PDDeployment object, got {_json_type(doc)}")
    not_json = yamlread.json_problems(doc) or _metadata_problems(doc.get("metadata"))
    if not_json:
        raise UnusableInput(f"{source}: {'; '.join(not_json)}")
    if doc.get("kind") != "PDDeployment" or doc.get("apiVersion") != "pdmtp.io/v1alpha1":
        raise UnusableInput(
            f"{source}: expected apiVersion pdmtp.io/v1alpha1 and kind PDDeployment, got "
            f"{doc.get('apiVersion')!r} {doc.get('kind')!r}"
        )
    try:
        return PDDeployment.model_validate(doc)
    except ValidationError as e:
        raise UnusableInput(f"{source}: {'; '.join(field_problems(e))}") from e


@functools.cache
def _schema() -> dict[str, Any]:
    return crd.openapi_schema()


def without_status(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without .status: the API server drops it from a create or an update (the
    status subresource owns it), so whatever a file carries there is neither refused nor kept."""
    return {k: value for k, value in doc.items() if k != "status"}


def as_stored(doc: Any) -> Any:
    """A PDDeployment document as the API server takes it in: .status dropped (`without_status`)
    and nulls of known fields dropped (pdmtp.yamlread.drop_nulls: `replicas: ~` is `replicas`
    left out, defaulted)."""
    return yamlread.drop_nulls(without_status(doc), _schema()) if isinstance(doc, dict) else doc


_META_STRINGS = ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion")
_META_FIELDS = frozenset(
    (
        *_META_STRINGS,
        *("generation", "deletionGracePeriodSeconds", "creationTimestamp", "deletionTimestamp"),
        *("labels", "annotations", "ownerReferences", "finalizers", "managedFields"),
    )
)


def _metadata_problems(meta: Any) -> list[str]:
    """What the API server's strict decoding of ObjectMeta refuses before any schema: a field
    ObjectMeta does not have, or a value of the wrong JSON type (pdmtp's own model reads only
    the fields it uses and lets the rest through)."""
    if not isinstance(meta, dict):
        return [] if meta is None else [f"metadata: must be an object (got {_json_type(meta)})"]
    out = []
    for key, value in meta.items():
        where = f"metadata.{key}"
        if key not in _META_FIELDS:
            out.append(f"{where}: unknown field")
        elif key in (*_META_STRINGS, "creationTimestamp", "deletionTimestamp"):
            if not isinstance(value, str):
                out.append(f"{where}: must be a string (got {_json_type(value)})")
        elif key in ("generation", "deletionGracePeriodSeconds"):
            if isinstance(value, bool) or not isinstance(value, int):
                out.append(f"{where}: must be an integer (got {_json_type(value)})")
        elif key in ("labels", "annotations"):
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                out.append(f"{where}: must be a map of strings")
        elif key == "finalizers":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                out.append(f"{where}: must be a list of strings")
        elif not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            out.append(f"{where}: must be a list of objects")
    return out


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return type(value).__name__


def load_one(path: str) -> PDDeployment:
    docs = load_documents(path)
    if len(docs) != 1:
        raise UnusableInput(f"{path}: expected one PDDeployment, found {len(docs)} documents")
    return parse(as_stored(docs[0]), path)


# ---- validate ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileVerdict:
    """The verdict on one document of a file, as `pdmtp validate` reports it."""

    source: str
    exit_code: int
    agreement: Agreement | None
    revision: str | None
    problems: tuple[Problem, ...] = ()
    document: Any = field(default=None, compare=False, repr=False)
    """The object judged, as read (`--server` sends the API server these very values)."""

    def as_json(self) -> dict[str, Any]:
        a = self.agreement
        return {
            "compatible": self.exit_code == EXIT_COMPATIBLE,
            "lookahead": {
                "prefill": None if a is None else a.prefill_lookahead,
                "decode": None if a is None else a.decode_lookahead,
            },
            "prefillBackoff": None if a is None else a.prefill_backoff,
            "revision": self.revision,
            "reasons": [{"reason": p.reason, "message": p.message} for p in self.problems],
        }

    def as_text(self) -> str:
        a = self.agreement
        if a is None:
            return "; ".join(p.message for p in self.problems)  # each names its source
        look = f"lookahead prefill={a.prefill_lookahead} decode={a.decode_lookahead}"
        word = "compatible" if a.compatible else "incompatible"
        if a.compatible and self.exit_code == EXIT_UNUSABLE:  # --server
            itself = any(p.reason == INVALID for p in self.problems)
            word = "compatible, but the API server refuses " + ("it" if itself else "its children")
        head = f"{self.source}: {word} ({look}, "
        head += f"prefill backoff {a.prefill_backoff}, revision {self.revision})"
        return "\n".join([head, *(f"  {p.line()}" for p in self.problems)])


def validate_file(path: str) -> list[FileVerdict]:
    try:
        docs = load_documents(path)
    except UnusableInput as e:
        return [FileVerdict(path, EXIT_UNUSABLE, None, None, (Problem(INVALID, str(e)),))]
    verdicts = []
    for i, doc in enumerate(docs):
        source = path if len(docs) == 1 else f"{path}#{i + 1}"
        stored = as_stored(doc)
        try:
            parse(stored, source)
        except UnusableInput as e:
            verdicts.append(
                FileVerdict(source, EXIT_UNUSABLE, None, None, (Problem(INVALID, str(e)),))
            )
            continue
        verdict = validate(stored)
        assert verdict.pdd is not None and verdict.agreement is not None
        code = EXIT_COMPATIBLE if verdict.compatible else EXIT_INCOMPATIBLE
        revision = revision_of(verdict.agreement.settings) if verdict.compatible else None
        verdicts.append(
            FileVerdict(source, code, verdict.agreement, revision, verdict.problems, doc)
        )
    return verdicts


def server_verdicts(
    verdicts: list[FileVerdict], paths: list[str], args: argparse.Namespace
) -> list[FileVerdict]:
    """`--server`: each compatible document dry-run on the cluster, the object itself (the same
    bytes the offline check judged, fieldValidation=Strict) and then its children
    (pdmtp.admission); a refusal makes the document unusable, in the API server's words."""
    # Imported here: the offline checks must not need a cluster client.
    from pdmtp import admission
    from pdmtp.kube import ApiError, load_client

    try:
        api = load_client(args.kubeconfig)
    except Exception as e:  # kubernetes.config raises several kinds; all mean "no cluster"
        raise UnusableInput(f"no cluster to talk to: {e}") from e
    if "-" in paths:
        raise UnusableInput("--server reads files, not standard input ('-')")
    out = []
    for verdict in verdicts:
        doc = verdict.document
        if verdict.exit_code != EXIT_COMPATIBLE or not isinstance(doc, dict):
            out.append(verdict)
            continue
        namespace = (doc.get("metadata") or {}).get("namespace") or args.namespace
        try:
            # The object itself first, as judged offline (server-side apply would even fail to
            # type a bad .status); then its children.
            refusal = admission.dry_run_object(
                api,
                yamlread.to_json_bytes(without_status(doc)),
                v.KIND,
                namespace,
                doc["metadata"]["name"],
            )
            problems = (
                [refusal.problem(INVALID)]
                if refusal is not None
                else admission.review(api, doc, namespace)
            )
        except ApiError as e:
            raise UnusableInput(f"{verdict.source}: the dry run failed: {e.message}") from e
        if problems:
            verdict = replace(verdict, exit_code=EXIT_UNUSABLE, problems=tuple(problems))
        out.append(verdict)
    return out


def cmd_validate(args: argparse.Namespace) -> int:
    verdicts = [verdict for path in args.files for verdict in validate_file(path)]
    if args.server:
        verdicts = server_verdicts(verdicts, args.files, args)
    for verdict in verdicts:
        print(json.dumps(verdict.as_json()) if args.output == "json" else verdict.as_text())
    return max(verdict.exit_code for verdict in verdicts)


# ---- render -----------------------------------------------------------------------------------


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


def cmd_render(args: argparse.Namespace) -> int:
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


# ---- plan -------------------------------------------------------------------------------------


def _cell(obs: dict[str, Any], revision: str) -> str:
    s = obs.get(revision)
    if s is None:
        return "-"
    phase = "serving" if s.serving else ("draining" if s.draining else "idle")
    return (
        f"P {s.prefill.ready}/{s.prefill.pods} D {s.decode.ready}/{s.decode.pods} "
        f"R {s.router.ready} {phase}"
    )


def _action(step: Step, obs: dict[str, Any]) -> str:
    notes = []
    for p in step.revisions:
        before = obs.get(p.revision)
        if before is None:
            notes.append(f"create {p.revision}")
            continue
        if p.delete:
            notes.append(f"retire {p.revision}")
            continue
        if p.drain_until is not None and not before.draining:
            notes.append(f"unroute {p.revision}")
        for role, old, new in (
            ("P", before.prefill.replicas, p.prefill),
            ("D", before.decode.replicas, p.decode),
            ("R", before.router.replicas, p.router),
        ):
            if old != new:
                notes.append(f"{p.revision} {role} {old}->{new}")
    return ", ".join(notes) or "wait"


def format_trace(trace: Trace, revisions: list[str]) -> str:
    width = 34
    header = f"{'t':>5}  " + "".join(f"{r:<{width}}" for r in revisions) + "action"
    lines = [header, "-" * len(header)]
    previous = ""
    quiet_since: float | None = None
    for now, observed, step in trace.steps:
        obs = {s.revision: s for s in observed}
        cells = "".join(f"{_cell(obs, r):<{width}}" for r in revisions)
        action = "rollout complete" if step.complete else _action(step, obs)
        if action == "wait" and cells == previous:
            # Nothing moves (a drain, or pods starting): one line for the whole stretch.
            quiet_since = now if quiet_since is None else quiet_since
            continue
        if quiet_since is not None:
            lines.append(f"{'':>5}  ... unchanged from {quiet_since:.0f}s to {now - 1:.0f}s")
            quiet_since = None
        lines.append(f"{now:>4.0f}s  {cells}{action}")
        previous = cells
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    old, new = load_one(args.from_file), load_one(args.to_file)
    start, _ = target_and_policy(check(old.spec))
    target, policy = target_and_policy(check(new.spec))
    if start.revision is None:
        raise UnusableInput(f"{args.from_file}: incompatible, so it cannot be what is serving")
    if target.revision is None:
        print(f"{args.to_file} is incompatible: no rollout starts; {start.revision} keeps serving.")
        for f in check(new.spec).findings:
            print(f"  {f.reason}: {f.message}")
        return EXIT_INCOMPATIBLE
    if target.revision == start.revision:
        _print_in_place(old, new, start, target)
        return 0
    return _simulate(args, new, start, target, policy)


def _print_in_place(old: PDDeployment, new: PDDeployment, start: Target, target: Target) -> None:
    changed = [r for r in ROLES if role_hash(old.spec, r) != role_hash(new.spec, r)]
    print(f"Same compat revision {start.revision}: no paired rollout.")
    if changed:
        print(
            f"Role-local change: {', '.join(changed)} roll in place "
            "(the Deployment's own rolling update)."
        )
    if (start.prefill, start.decode) != (target.prefill, target.decode):
        print(
            f"Scaling: prefill {start.prefill}->{target.prefill}, "
            f"decode {start.decode}->{target.decode}."
        )


def _simulate(
    args: argparse.Namespace, new: PDDeployment, start: Target, target: Target, policy: Policy
) -> int:
    """Play the rollout on the simulated cluster: the canary hold, the rollback path."""
    assert start.revision is not None and target.revision is not None
    revisions = [start.revision, target.revision]
    failing = {target.revision} if args.fail_after is not None else set()
    sim = SimCluster.serving(start.revision, start, failing=failing)
    monitor = InvariantMonitor(policy)
    rng = random.Random(args.seed)
    trace = Trace()
    canary = new.spec.rollout.canary
    try:
        if canary is not None:
            held = replace(policy, canary_percent=canary.percent)
            run(
                sim,
                monitor,
                target,
                rng,
                policy=held,
                ready_chance=args.ready_chance,
                trace=trace,
                until=lambda step: step.outcome == "Held",
            )
            print(format_trace(trace, revisions))
            if trace.steps and trace.steps[-1][2].outcome == "Held":
                print(
                    f"Canary holds: {target.revision} serves {canary.percent}% of each role next "
                    f"to {start.revision}; `pdmtp rollout promote` continues:"
                )
            trace = Trace()
        if args.fail_after is not None:
            run(
                sim,
                monitor,
                target,
                rng,
                max_ticks=args.fail_after,
                ready_chance=args.ready_chance,
                trace=trace,
            )
            print(format_trace(trace, revisions))
            print(
                f"{target.revision} fails (its engines never get ready); rolling back "
                f"to {start.revision}:"
            )
            back = replace(start, prefill=target.prefill, decode=target.decode)
            trace = Trace()
            run(sim, monitor, back, rng, ready_chance=args.ready_chance, trace=trace)
        else:
            run(sim, monitor, target, rng, ready_chance=args.ready_chance, trace=trace)
    except InvariantViolation as e:
        print(format_trace(trace, revisions))
        print(f"INVARIANT VIOLATED: {e}")
        return 3
    print(format_trace(trace, revisions))
    status = "completed" if trace.complete else "did not complete"
    rollback = args.fail_after is not None
    what, source, dest = (
        ("Rollback", target, start) if rollback else ("Paired rollout", start, target)
    )
    print(
        f"{what} {source.revision} -> {dest.revision} {status} in "
        f"{len(trace.steps)} steps (maxSurge {policy.max_surge}, maxUnavailable "
        f"{policy.max_unavailable}, drainSeconds {policy.drain_seconds}); invariants 2-5 and 8 "
        "held at every step."
    )
    return 0 if trace.complete else 3


# ---- crd / run --------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    # Imported here: the offline commands must not need a cluster client or kopf.
    import logging

    from pdmtp.controller import Options, run
    from pdmtp.health import GRACE_SECONDS
    from pdmtp.kube import Kube, load_client
    from pdmtp.metrics import Metrics
    from pdmtp.scrape import source_from
    from pdmtp.webhook import WebhookOptions

    # kopf installs the log handler (controller.run): one format, one line per record.
    logging.getLogger("pdmtp").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    # Every liveness probe and metrics scrape would be an INFO line otherwise.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    namespaces = () if args.all_namespaces else tuple(args.namespace or ["default"])
    metrics = Metrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_address)
    options = Options(
        namespaces=namespaces,
        resync_seconds=args.resync_seconds,
        workers=args.workers,
        grace_seconds=args.unwatched_grace_seconds or GRACE_SECONDS,
    )
    try:
        source = source_from(args.metrics_source)
    except ValueError as e:
        raise UnusableInput(str(e)) from e
    try:
        api = load_client(args.kubeconfig)
    except Exception as e:  # kubernetes.config raises several kinds; all mean "no cluster"
        raise UnusableInput(f"no cluster to talk to: {e}") from e
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
    run(kube, options, metrics, health=health, webhook=webhook, source=source)
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    # Imported here: the offline commands must not need a cluster client.
    from pdmtp import rolloutctl
    from pdmtp.kube import Kube, load_client

    try:
        api = Kube(load_client(args.kubeconfig))
    except Exception as e:  # kubernetes.config raises several kinds; all mean "no cluster"
        raise UnusableInput(f"no cluster to talk to: {e}") from e
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


def cmd_crd(args: argparse.Namespace) -> int:
    print(crd_yaml(args.kind), end="")
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    from pdmtp.api.docs import field_reference

    print(field_reference(), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdmtp",
        description="vLLM prefill/decode serving with MTP on Kubernetes: operator and tools.",
    )
    parser.add_argument("--version", action="version", version=f"pdmtp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("crd", help="print a CRD (generated from the model)")
    p.add_argument(
        "--kind",
        choices=[v.KIND, v.ROLE_SCALE_KIND],
        default=v.KIND,
        help="PDDeployment (default) or PDRoleScale (an External-autoscaled role's /scale)",
    )
    p.set_defaults(func=cmd_crd)

    p = sub.add_parser("docs", help="print the PDDeployment field reference (Markdown)")
    p.set_defaults(func=cmd_docs)

    p = sub.add_parser(
        "validate",
        help="check PDDeployment files: exit 0 compatible, 1 incompatible, 2 unusable",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="YAML files ('-' for stdin)")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.add_argument(
        "--server",
        action="store_true",
        help="also dry-run the rendered children on the cluster (dryRun=All, changes nothing): "
        "exit 2 when the API server would refuse one",
    )
    p.add_argument("--kubeconfig", help="--server: default $KUBECONFIG, then ~/.kube/config")
    p.add_argument(
        "-n", "--namespace", default="default", help="--server: when a document names none"
    )
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("render", help="print the child objects of a PDDeployment")
    p.add_argument("file", metavar="FILE")
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    p.add_argument("-n", "--namespace", default="default", help="when the file names none")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("plan", help="simulate the rollout from one spec to another")
    p.add_argument("--from", dest="from_file", required=True, metavar="OLD.yaml")
    p.add_argument("--to", dest="to_file", required=True, metavar="NEW.yaml")
    p.add_argument("--seed", type=int, default=0, help="order in which pods become ready")
    p.add_argument(
        "--ready-chance",
        type=float,
        default=0.6,
        help="chance a starting pod turns ready each simulated second",
    )
    p.add_argument(
        "--fail-after",
        type=int,
        metavar="SECONDS",
        help="show the rollback path: the new revision fails after this many seconds",
    )
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "rollout",
        help="rollout control: status, pause, resume, promote, undo, history (kubectl style)",
    )
    p.add_argument("action", choices=("status", "pause", "resume", "promote", "undo", "history"))
    p.add_argument("name", metavar="NAME", help="the PDDeployment")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG, then ~/.kube/config")
    p.add_argument(
        "--timeout", type=float, default=0, help="status: give up after this many seconds (0: wait)"
    )
    p.add_argument("--to-revision", type=int, help="undo: the recorded revision number")
    p.set_defaults(func=cmd_rollout)

    p = sub.add_parser("run", help="run the operator")
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
        help="serve /healthz (liveness) and /readyz (readiness) here (empty: none)",
    )
    p.add_argument(
        "--metrics-source",
        metavar="http|dir:PATH",
        help=(
            "where the autoscaler reads the engines' metrics: http (default) scrapes each engine "
            "pod's metrics-only port; dir:PATH reads PATH/<namespace>/<pod>.prom (tests whose "
            "pod IPs are fake)"
        ),
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
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_run)
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


if __name__ == "__main__":
    sys.exit(main())
