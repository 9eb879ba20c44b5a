"""A router's engine membership: which engines a revision's router should list (`Membership`,
rendered into its argv), which it lists (read back from its pods' argv), and the URLs of both."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pdmtp.api import vocabulary as v
from pdmtp.core.hashing import short_hash
from pdmtp.core.objects import (
    Obj,
    engine_url,
    serves,
)

MEMBERSHIP_TOKEN_LENGTH = 16


@dataclass(frozen=True, order=True)
class Prefill:
    """A prefill engine as the router addresses it."""

    url: str
    bootstrap_port: int


@dataclass(frozen=True)
class Membership:
    """The engines one revision's router may route to, read from observed pods."""

    prefills: tuple[Prefill, ...]
    decodes: tuple[str, ...]
    token: str
    """Changes whenever the router must restart: membership, or a prefill engine restarted."""

    @property
    def routable(self) -> bool:
        return bool(self.prefills) and bool(self.decodes)


def _restarts(pod: Obj) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount", 0)) for s in statuses)


def revision_membership(
    pods: Iterable[Obj],
    *,
    deployment_name: str,
    revision: str,
    bootstrap_port: int = v.DEFAULT_BOOTSTRAP_PORT,
    leaving: frozenset[str] = frozenset(),
) -> Membership:
    """Pick the Ready engine pods of exactly one (deployment, revision) from pod objects (dicts),
    leaving out those marked to leave (observed, or named in `leaving`: this step's marks).

    A pod of another revision or deployment is never selected, whatever else it carries, so a
    router can never pair across revisions. The order is stable (sorted), so the same pods always
    render the same arguments and an unchanged revision never rolls its router.
    """
    prefills: list[Prefill] = []
    decodes: list[str] = []
    identity: list[str] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(v.LABEL_NAME) != deployment_name or labels.get(v.LABEL_REVISION) != revision:
            continue
        role = labels.get(v.LABEL_ROLE)
        ip = (pod.get("status") or {}).get("podIP")
        if role not in v.ENGINE_ROLES or not ip or not serves(pod):
            continue
        if meta.get("name") in leaving:
            continue
        url = engine_url(ip)
        if role == "prefill":
            annotated = (meta.get("annotations") or {}).get(v.ANNOTATION_BOOTSTRAP_PORT)
            port = int(annotated) if annotated else bootstrap_port
            prefills.append(Prefill(url, port))
            # vLLM mints a new engine_id whenever a prefill engine starts; the router learns ids
            # only at its own start, so a prefill container restart must restart the router.
            identity.append(f"p {url} {port} {meta.get('uid', '')} {_restarts(pod)}")
        else:
            decodes.append(url)
            identity.append(f"d {url}")
    token = short_hash("\n".join(sorted(identity)), MEMBERSHIP_TOKEN_LENGTH)
    return Membership(tuple(sorted(prefills)), tuple(sorted(decodes)), token)


def router_urls(args: Iterable[str]) -> frozenset[str]:
    """The engine URLs a router's args list (`--prefill URL [PORT]`, `--decode URL`)."""
    args = list(args)
    return frozenset(args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--prefill", "--decode"))


def container_args(pod_spec: Obj) -> list[str]:
    containers = pod_spec.get("containers") or [{}]
    return list(containers[0].get("args") or [])
