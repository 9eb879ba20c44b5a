"""The executor: one reconcile's actions applied in order through the API adapter (`kube`, whose
writes pass the leader's fence), stopping at the first refusal; every accepted write leaves an
expectation (`expectations`) that the key's next reconcile waits for, since writes never enter
the caches. No decisions here: the actions come whole from `core.reconcile.decide`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pdmtp.api.kinds import POD
from pdmtp.core.actions import Action, Annotate, Apply, Delete, Rejection, Scale, SetStatus
from pdmtp.core.objects import Key, resource_version
from pdmtp.expectations import Expectations, after_delete, after_write
from pdmtp.kube import ApiError, Kube
from pdmtp.metrics import Metrics

log = logging.getLogger("pdmtp")


@dataclass(frozen=True)
class Applied:
    """How a step's actions went: the refusal that stopped it, if any, and the keys of the
    actions not applied (the refused or stale one and every one after it)."""

    refused: tuple[Rejection, ...] = ()
    unapplied: tuple[str, ...] = ()
    stale: bool = False
    """Stopped by a conditional write whose object had changed since it was observed."""


@dataclass
class Executor:
    kube: Kube
    expectations: Expectations
    metrics: Metrics
    held: Callable[[str, str, str], str | None]
    """The resourceVersion the caches hold of (kind, namespace, name): what an expectation
    counts from."""

    def apply(self, key: Key, actions: tuple[Action, ...]) -> Applied:
        """Apply in order and stop at the first refusal: the actions after it were planned on
        a world where it succeeded, and the next reconcile re-plans from what is there."""
        for i, action in enumerate(actions):
            try:
                self.apply_one(key, action)
            except ApiError as e:
                rest = tuple(a.key for a in actions[i + 1 :])
                if e.status == 409 and getattr(action, "resource_version", None) is not None:
                    log.info("%s changed since it was observed; re-planning", action.key)
                    self.metrics.stale_writes.inc()
                    return Applied((), (action.key, *rest), stale=True)
                log.warning("The API server refused %s: %s", action.key, e.message)
                rejection = Rejection(action.key, e.status, e.message)
                return Applied((rejection,), (action.key, *rest))
        return Applied()

    def apply_one(self, key: Key, action: Action) -> None:
        """Apply one action; an accepted write leaves the expectation its key waits for."""
        namespace = key[0]
        before = self.held(action.kind, namespace, action.name)
        answer: Mapping[str, Any] | None
        if isinstance(action, Apply):
            answer = self.kube.apply(action.manifest, action.resource_version)
            verb = "Updated" if action.exists else "Created"
            log.info("%s %s", verb, action.key, extra={"namespace": namespace})
        elif isinstance(action, Scale):
            answer = self.kube.scale(
                namespace, action.name, action.replicas, action.resource_version
            )
            log.info("Scaled %s to %d", action.key, action.replicas)
        elif isinstance(action, Delete):
            self.kube.delete(action.kind, namespace, action.name)
            self.expectations.expect(key, after_delete(action.kind, action.name, before))
            log.info("Deleted %s", action.key)
            return
        elif isinstance(action, SetStatus):
            answer = self.kube.patch_status(
                namespace, action.name, action.status, action.old, action.kind
            )
        elif isinstance(action, Annotate):
            body = {"metadata": {"annotations": dict(action.annotations)}}
            answer = self.kube.patch(
                POD.kind, namespace, action.name, body, "application/merge-patch+json"
            )
            log.info("Marked %s: %s", action.key, body["metadata"]["annotations"])
        created = isinstance(action, Apply) and not action.exists
        expectation = after_write(
            action.kind, action.name, before, resource_version(answer), created=created
        )
        self.expectations.expect(key, expectation)
