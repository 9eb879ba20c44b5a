"""`pdmtp validate`: the offline verdict on each document of PDDeployment files, and with
--server the API server's dry run of the object and its children."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, replace
from typing import Any

from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.api.v1alpha1 import VerificationSpec
from pdmtp.cli.base import EXIT_COMPATIBLE, EXIT_INCOMPATIBLE, EXIT_UNUSABLE, UnusableInput, connect
from pdmtp.cli.inputs import as_stored, load_documents, parse, without_status
from pdmtp.core.agreement import Agreement
from pdmtp.core.revision import revision_of
from pdmtp.core.validation import Problem, validate
from pdmtp.tools import yamlread

INVALID = reasons.INVALID_SPEC


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    verdicts = [verdict for path in args.files for verdict in validate_file(path)]
    if args.server:
        verdicts = server_verdicts(verdicts, args.files, args)
    for verdict in verdicts:
        print(json.dumps(verdict.as_json()) if args.output == "json" else verdict.as_text())
    return max(verdict.exit_code for verdict in verdicts)


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
    verification: VerificationSpec | None = None
    """How the operator will judge its revisions (spec.verification, defaults filled in)."""
    load_failure_policy: str | None = None
    """What its decodes do with a KV load that fails (spec.kvTransfer.loadFailurePolicy, else
    vLLM's default)."""

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
            "verification": None if self.verification is None else _knobs(self.verification),
            "loadFailurePolicy": self.load_failure_policy,
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
        judged = [] if self.verification is None else [f"  {_judged(self.verification)}"]
        if self.load_failure_policy is not None:
            judged.append(f"  {_load_failure(self.load_failure_policy, self.document)}")
        return "\n".join([head, *judged, *(f"  {p.line()}" for p in self.problems)])


def _knobs(spec: VerificationSpec) -> dict[str, Any]:
    """spec.verification with the spec's own field names, every default filled in; the
    deprecated acceptanceTolerancePercent left out (it stands for smallestRegressionPercent)."""
    knobs: dict[str, Any] = spec.model_dump(by_alias=True, mode="json")
    knobs.pop("acceptanceTolerancePercent")
    knobs["falseRollbackPercent"] = round(spec.false_rollback * 100, 6)
    knobs["smallestRegressionPercent"] = round(spec.smallest_regression * 100)
    return knobs


def _judged(spec: VerificationSpec) -> str:
    """spec.verification in a line (`_knobs`)."""
    if spec.mode == "Off":
        return "verification: Off (nothing is judged)"
    knobs = {k: val for k, val in _knobs(spec).items() if k != "mode"}
    listed = ", ".join(f"{k} {val:g}" for k, val in knobs.items() if val is not None)
    return f"verification: {spec.mode} ({listed})"


def _load_failure(policy: str, document: Any) -> str:
    spec = (document or {}).get("spec") if isinstance(document, dict) else None
    kv = (spec or {}).get("kvTransfer") if isinstance(spec, dict) else None
    stated = isinstance(kv, dict) and "loadFailurePolicy" in kv
    what = (
        "a KV load that fails fails its request"
        if policy == "fail"
        else "a KV load that fails is recomputed by the decode"
    )
    return f"decode kv_load_failure_policy: {policy} ({what}" + (
        ")" if stated else "; unset: vLLM's default)"
    )


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
            FileVerdict(
                source,
                code,
                verdict.agreement,
                revision,
                verdict.problems,
                doc,
                verdict.pdd.spec.effective_verification,
                verdict.pdd.spec.kv_transfer.load_failure_policy or v.VLLM_KV_LOAD_FAILURE_POLICY,
            )
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
    from pdmtp.kube import ApiError

    api = connect(args.kubeconfig)
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
