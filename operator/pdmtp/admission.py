"""Admission that knows the pod: a PDDeployment is refused when the API server would refuse the
children it renders.

The CRD's schema (Kubernetes' own core/v1 types) and CEL rules, and the offline check
(`pdmtp.core.validation`), refuse what a schema can say. What only the Deployment's own
validation knows (a spread constraint's maxSkew of 0, a selector operator without values, a
group id out of range, an extended resource requested without a limit) is found here: the
children are rendered with the pure core, exactly as the operator would write them, and each is
sent to the API server as a server-side apply with `dryRun=All`, which validates, admits and
discards it. The first refusal of each child is reported in the server's own words.

Used by the opt-in validating webhook (pdmtp.manager's `admit`) and by `pdmtp validate
--server`. Needs the operator's write permissions on its children (the same verbs as the
reconciler: a dry run is authorised as the write it stands for); changes nothing.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from pdmtp.api import reasons
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.core.agreement import check
from pdmtp.core.render.children import RevisionReplicas, revision_children, shared_children
from pdmtp.core.rollout.steering import target_and_policy
from pdmtp.core.validation import Problem, validate
from pdmtp.kube import FIELD_MANAGER, ApiError, path, send

log = logging.getLogger(__name__)

REFUSED_STATUSES = frozenset({400, 403, 409, 422})
"""Statuses that mean "this object would be refused" (invalid, forbidden by a policy)."""
DRY_RUN_TIMEOUT_SECONDS = 5.0
"""Per child: the webhook's own deadline (kopf's default 30 s; ours is shorter) covers them all."""


def children(pdd: PDDeployment) -> list[dict[str, Any]]:
    """What the operator would write for `pdd`'s spec revision, once rolled out (no owner
    reference: the owner may not exist yet, and a dry run only validates)."""
    agreement = check(pdd.spec)
    target, _ = target_and_policy(agreement)
    assert target.revision is not None, "an incompatible spec has no revision to render"
    replicas = RevisionReplicas(target.prefill, target.decode, target.router)
    rendered = [
        *shared_children(pdd, agreement.settings),
        *revision_children(pdd, target.revision, replicas, agreement, None),
    ]
    out = []
    for manifest in rendered:
        manifest = copy.deepcopy(manifest)
        manifest["metadata"].pop("ownerReferences", None)
        out.append(manifest)
    return out


@dataclass(frozen=True)
class Refusal:
    kind: str
    name: str
    message: str

    def problem(self, reason: str = reasons.CHILD_REJECTED) -> Problem:
        return Problem(
            reason, f"the API server would refuse {self.kind}/{self.name}: {self.message}"
        )


def dry_run(api: client.ApiClient, manifest: Mapping[str, Any]) -> Refusal | None:
    """Server-side apply `manifest` with dryRun=All: None if the server would take it."""
    meta = manifest["metadata"]
    return _dry_apply(api, manifest["kind"], meta["namespace"], meta["name"], json.dumps(manifest))


def dry_run_object(
    api: client.ApiClient, body: bytes, kind: str, namespace: str, name: str
) -> Refusal | None:
    """Server-side apply these exact bytes (`pdmtp validate --server`: the object the offline
    verdict judged, as pdmtp.tools.yamlread read it) with dryRun=All and fieldValidation=Strict, as
    `kubectl apply --dry-run=server --validate=strict` does: None if the server would take it."""
    return _dry_apply(api, kind, namespace, name, body.decode("utf-8"), strict=True)


def _dry_apply(
    api: client.ApiClient, kind: str, namespace: str, name: str, body: str, strict: bool = False
) -> Refusal | None:
    query = [("fieldManager", FIELD_MANAGER), ("force", "true"), ("dryRun", "All")]
    if strict:
        query.append(("fieldValidation", "Strict"))
    try:
        response = send(
            api,
            "PATCH",
            path(kind, namespace, name),
            query=query,
            body=body,
            content_type="application/apply-patch+yaml",
            timeout=DRY_RUN_TIMEOUT_SECONDS,
        )
        response.read()
    except ApiError as e:
        if e.status in REFUSED_STATUSES:
            return Refusal(kind, name, e.message)
        raise
    return None


def review(api: client.ApiClient, body: Mapping[str, Any], namespace: str) -> list[Problem]:
    """Every problem of the PDDeployment `body`: the offline verdict's, else each child's
    refusal by the API server (dry runs in `namespace`, the object's own)."""
    verdict = validate(body)
    if verdict.problems or verdict.pdd is None:
        return list(verdict.problems)
    pdd = verdict.pdd
    if pdd.metadata.namespace != namespace:
        meta = pdd.metadata.model_copy(update={"namespace": namespace})
        pdd = pdd.model_copy(update={"metadata": meta})
    problems = []
    for manifest in children(pdd):
        refusal = dry_run(api, manifest)
        if refusal is not None:
            problems.append(refusal.problem())
    return problems
