"""Pod-level settings of an engine pod: spec.pod under the role's own (resolved in `effective`),
and spec.placement turned into affinity and spread terms for one revision's pods.

`placement.topologyKey` keeps every prefill and decode pod of a revision in one domain of that
node label: a required pod-affinity term selecting the revision's engine pods (the first pod may
land anywhere, the scheduler's rule for a term its own labels match). `placement.spreadKey`
spreads each role's pods of the revision across that label's domains (maxSkew 1).
"""

from __future__ import annotations

import copy

from pdmtp.api import vocabulary as v
from pdmtp.api.vocabulary import EngineRole
from pdmtp.core.effective import RoleLocal
from pdmtp.core.objects import Manifest


def pod_fields(
    local: RoleLocal, name: str, revision: str, role: EngineRole
) -> tuple[Manifest, list[Manifest]]:
    """The pod spec fields the settings and the placement set (absent when unset), and the
    engine container's mounts of the extra volumes."""
    pod = local.pod
    out: Manifest = {}
    if pod.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": s.name} for s in pod.image_pull_secrets]
    for field, key in (
        ("priority_class_name", "priorityClassName"),
        ("scheduler_name", "schedulerName"),
        ("service_account_name", "serviceAccountName"),
    ):
        if (value := getattr(pod, field)) is not None:
            out[key] = value
    if pod.pod_security_context:
        out["securityContext"] = copy.deepcopy(pod.pod_security_context)
    affinity = copy.deepcopy(pod.affinity) if pod.affinity else {}
    spread = copy.deepcopy(pod.topology_spread_constraints or [])
    placement = local.placement
    revision_pods = {"matchLabels": {v.LABEL_NAME: name, v.LABEL_REVISION: revision}}
    if placement is not None and placement.topology_key is not None:
        term = {"labelSelector": revision_pods, "topologyKey": placement.topology_key}
        required = affinity.setdefault("podAffinity", {}).setdefault(
            "requiredDuringSchedulingIgnoredDuringExecution", []
        )
        required.append(term)
    if placement is not None and placement.spread_key is not None:
        role_pods = {"matchLabels": {**revision_pods["matchLabels"], v.LABEL_ROLE: role}}
        spread.append(
            {
                "maxSkew": 1,
                "topologyKey": placement.spread_key,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": role_pods,
            }
        )
    if affinity:
        out["affinity"] = affinity
    if spread:
        out["topologySpreadConstraints"] = spread
    if pod.volumes:
        out["volumes"] = [vol.model_dump(by_alias=True, exclude_none=True) for vol in pod.volumes]
    mounts = [m.model_dump(by_alias=True, exclude_none=True) for m in pod.volume_mounts or []]
    return out, mounts
