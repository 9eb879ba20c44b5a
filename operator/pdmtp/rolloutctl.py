"""`pdmtp rollout status|pause|resume|promote|undo|history NAME`: rollout control from the
command line, in the manner of `kubectl rollout` (also `kubectl pdmtp rollout ...`, the plugin).

Each command is one small request against the API server with the caller's kubeconfig; `status`
polls the PDDeployment's conditions until the rollout completes (exit 0) or fails (exit 1).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.core.render.history import Recorded, recorded
from pdmtp.core.status.conditions import find, parse_conditions
from pdmtp.kube import ApiError, Kube

FAILED = {
    reasons.PROGRESS_DEADLINE_EXCEEDED,
    reasons.ROLLOUT_FAILED,
    reasons.ROLLOUT_ABORTED,
    reasons.ROLLOUT_BLOCKED,
    reasons.CHILD_REJECTED,
}
MERGE = "application/merge-patch+json"


class RolloutError(Exception):
    """The command could not do what was asked; the message says why."""


def get(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    obj = kube.read(v.KIND, namespace, name)
    if obj is None:
        raise RolloutError(f'PDDeployment "{name}" not found in namespace {namespace}')
    return obj


def _patch(kube: Kube, namespace: str, name: str, body: Any, content_type: str) -> None:
    try:
        kube.patch(v.KIND, namespace, name, body, content_type)
    except ApiError as e:
        raise RolloutError(f"the API server refused the change: {e.message}") from e


def status(
    kube: Kube,
    namespace: str,
    name: str,
    timeout: float,
    out: Callable[[str], None] = print,
    interval: float = 1.0,
) -> int:
    """Wait for the rollout: 0 once complete, 1 once failed or rolled back, or on timeout."""
    deadline = time.monotonic() + timeout if timeout > 0 else None
    last = ""
    while True:
        obj = get(kube, namespace, name)
        current = (obj.get("status") or {}).get("observedGeneration") == obj["metadata"].get(
            "generation"
        )
        conditions = parse_conditions((obj.get("status") or {}).get("conditions") or [])
        progressing = find(conditions, reasons.PROGRESSING)
        compatible = find(conditions, reasons.CONFIG_COMPATIBLE)
        reason = progressing.reason if progressing else "Pending"
        line = f"{reason}: {progressing.message if progressing else ''}"
        if current and compatible is not None and compatible.status == "False":
            out(f"rollout of {name} refused: {compatible.reason}: {compatible.message}")
            return 1
        if current and reason == reasons.ROLLOUT_COMPLETE:
            out(f'pddeployment "{name}" successfully rolled out')
            return 0
        if current and reason in FAILED:
            out(f"rollout of {name} failed: {line}")
            return 1
        if line != last:
            out(f"Waiting for rollout of {name} to finish: {line}")
            last = line
        if deadline is not None and time.monotonic() > deadline:
            out(f"timed out waiting for the rollout of {name}: {line}")
            return 1
        time.sleep(interval)


def pause(kube: Kube, namespace: str, name: str, paused: bool) -> str:
    get(kube, namespace, name)
    _patch(
        kube,
        namespace,
        name,
        {"spec": {"rollout": {"paused": paused}}},
        MERGE,
    )
    return f"pddeployment {name} {'paused' if paused else 'resumed'}"


def promote(kube: Kube, namespace: str, name: str) -> str:
    obj = get(kube, namespace, name)
    revision = (obj.get("status") or {}).get("updateRevision")
    if not revision:
        raise RolloutError(f"{name} has no update revision to promote yet")
    body = {"metadata": {"annotations": {v.ANNOTATION_PROMOTE: revision}}}
    _patch(kube, namespace, name, body, MERGE)
    return f"pddeployment {name} promoted revision {revision}"


def history(kube: Kube, namespace: str, name: str) -> list[Recorded]:
    """The recorded revisions, oldest first."""
    selector = f"{v.LABEL_NAME}={name},{v.LABEL_MANAGED_BY}={v.MANAGED_BY}"
    return recorded(kube.list_objects("ControllerRevision", namespace, selector), name)


def undo(kube: Kube, namespace: str, name: str, to_revision: int | None) -> str:
    """Set the spec back to a recorded one: the given number, else the newest whose revision
    differs from what the spec asks now (kubectl's "previous revision")."""
    obj = get(kube, namespace, name)
    records = history(kube, namespace, name)
    now = (obj.get("status") or {}).get("updateRevision")
    if to_revision is not None:
        chosen = next((r for r in records if r.number == to_revision), None)
        if chosen is None:
            numbers = ", ".join(str(r.number) for r in records) or "none"
            raise RolloutError(f"no revision {to_revision} of {name} (recorded: {numbers})")
    else:
        older = [r for r in records if r.revision != now]
        if not older:
            raise RolloutError(f"{name} has no previous revision to roll back to")
        chosen = older[-1]
    _patch(
        kube,
        namespace,
        name,
        [{"op": "replace", "path": "/spec", "value": dict(chosen.spec)}],
        "application/json-patch+json",
    )
    return f"pddeployment {name} rolled back to revision {chosen.number} ({chosen.revision})"


def format_history(records: list[Recorded]) -> str:
    lines = ["REVISION  HASH      CREATED               CHANGE"]
    for r in records:
        change = json.dumps(r.spec.get("speculative") or {}, sort_keys=True)
        lines.append(f"{r.number:<9} {r.revision:<9} {r.created:<21} {change}")
    return "\n".join(lines)
