"""`pdmtp.api.kinds` is the one table of kinds: deploy/operator/rbac.yaml grants exactly what it
needs (no more, no less), every kind the core applies is watched into the cache, and every path is
one the API server serves."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import kubernetes.client.api
import pytest
import yaml
from builders import pdd
from pdmtp.api import kinds
from pdmtp.api.kinds import Grant
from pdmtp.core.actions import Apply
from pdmtp.core.context import Observed
from pdmtp.core.reconcile import decide

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "deploy" / "operator" / "rbac.yaml"
ROLE_KINDS = {"Role", "ClusterRole"}


def needed_grants() -> frozenset[Grant]:
    """Every permission the operator's ServiceAccount needs in the namespaces it serves (its
    ClusterRole), and nothing else."""
    return frozenset(g for k in (*kinds.KINDS, *kinds.KOPF) if not k.home for g in k.grants())


def home_grants() -> frozenset[Grant]:
    """What it needs in its own namespace only (a Role there): the leader Lease."""
    return frozenset(g for k in kinds.KINDS if k.home for g in k.grants())


def rbac_docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(RBAC.read_text()) if d]


def rbac_problems(
    docs: Iterable[dict[str, Any]],
    needed: frozenset[Grant] | None = None,
    home: frozenset[Grant] | None = None,
) -> list[str]:
    """Where the roles in `docs` differ from what the table needs: the ClusterRole from
    `needed`, the Role in the operator's own namespace from `home`; empty when they match."""
    wanted = {
        "ClusterRole": needed_grants() if needed is None else needed,
        "Role": home_grants() if home is None else home,
    }
    problems = []
    docs = list(docs)
    for role_kind, needs in wanted.items():
        granted: set[Grant] = set()
        for doc in docs:
            if doc.get("kind") != role_kind:
                continue
            for rule in doc.get("rules") or []:
                # The table speaks of whole resources by group: anything finer or wider is a
                # finding.
                for key in ("resourceNames", "nonResourceURLs"):
                    if key in rule:
                        problems.append(f"{key} in {rule}: not expressed by the table")
                triples = [
                    (group, resource, verb)
                    for group in rule.get("apiGroups") or []
                    for resource in rule.get("resources") or []
                    for verb in rule.get("verbs") or []
                ]
                if any("*" in t for t in triples):
                    problems.append(f"wildcard in {rule}")
                granted.update(triples)
        problems += [
            f"grants {g}, which no row of the table needs ({role_kind})"
            for g in sorted(granted - needs)
        ]
        problems += [
            f"misses {g}, which the table needs ({role_kind})" for g in sorted(needs - granted)
        ]
    return problems


def test_rbac_grants_exactly_what_the_table_needs() -> None:
    assert rbac_problems(rbac_docs()) == []


def test_the_role_is_bound_to_the_operators_service_account() -> None:
    docs = rbac_docs()
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    subject = {
        "kind": "ServiceAccount",
        **{k: account["metadata"][k] for k in ("name", "namespace")},
    }
    for role_kind, binding_kind in (("ClusterRole", "ClusterRoleBinding"), ("Role", "RoleBinding")):
        (role,) = [d for d in docs if d["kind"] == role_kind]
        (binding,) = [d for d in docs if d["kind"] == binding_kind]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [subject]
        if role_kind == "Role":  # the Lease lives in the operator's own namespace only
            assert role["metadata"]["namespace"] == binding["metadata"]["namespace"]
            assert role["metadata"]["namespace"] == account["metadata"]["namespace"]
    manifest = REPO / "deploy" / "operator" / "operator.yaml"
    operator = next(yaml.safe_load_all(manifest.read_text()))
    assert operator["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]


def _rule(docs: list[dict[str, Any]], resource: str) -> dict[str, Any]:
    role = next(d for d in docs if d["kind"] in ROLE_KINDS)
    rule: dict[str, Any] = next(r for r in role["rules"] if resource in r["resources"])
    return rule


def _drop_verb(docs: list[dict[str, Any]]) -> None:
    _rule(docs, "networkpolicies")["verbs"].remove("watch")


def _add_verb(docs: list[dict[str, Any]]) -> None:
    _rule(docs, "serviceaccounts")["verbs"].append("delete")


def _drop_rule(docs: list[dict[str, Any]]) -> None:
    role = next(d for d in docs if d["kind"] in ROLE_KINDS)
    role["rules"].remove(_rule(docs, "events"))


def _add_secrets(docs: list[dict[str, Any]]) -> None:
    docs.append(
        {
            "kind": "Role",
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
        }
    )


def _drop_lease_update(docs: list[dict[str, Any]]) -> None:
    (role,) = [d for d in docs if d["kind"] == "Role"]
    role["rules"][0]["verbs"].remove("update")


def _wildcard(docs: list[dict[str, Any]]) -> None:
    _rule(docs, "pods")["verbs"] = ["*"]


def _named(docs: list[dict[str, Any]]) -> None:
    _rule(docs, "pods")["resourceNames"] = ["one"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_drop_verb, "misses ('networking.k8s.io', 'networkpolicies', 'watch')"),
        (_add_verb, "grants ('', 'serviceaccounts', 'delete')"),
        (_drop_rule, "misses ('', 'events', 'create')"),
        (_add_secrets, "grants ('', 'secrets', 'get')"),
        (_drop_lease_update, "misses ('coordination.k8s.io', 'leases', 'update')"),
        (_wildcard, "wildcard in"),
        (_named, "resourceNames in"),
    ],
)
def test_a_mutated_rbac_is_caught(
    mutate: Callable[[list[dict[str, Any]]], None], expected: str
) -> None:
    docs = copy.deepcopy(rbac_docs())
    mutate(docs)
    problems = rbac_problems(docs)
    assert any(p.startswith(expected) for p in problems), problems


def test_a_row_rbac_does_not_cover_is_caught() -> None:
    # A kind added to the table without its RBAC rule: the comparison names the missing grants.
    extra = kinds.Kind("ConfigMap", "", "v1", "configmaps", kinds.READ, watched=True)
    problems = rbac_problems(rbac_docs(), needed_grants() | extra.grants())
    assert problems == [
        "misses ('', 'configmaps', 'list'), which the table needs (ClusterRole)",
        "misses ('', 'configmaps', 'watch'), which the table needs (ClusterRole)",
    ]


def test_every_kind_the_core_applies_is_watched_and_writable() -> None:
    # A child the reconciler writes but the cache does not watch would never be observed:
    # it would be re-created on every pass.
    body = pdd("x").dict()
    body["metadata"].update(namespace="ns", uid="u-1", generation=1)
    body["spec"]["autoscaling"] = {
        "decode": {"source": "External", "minReplicas": 1, "maxReplicas": 2}
    }  # so the External role's scale endpoint is among them
    applied = {a.kind for a in decide(Observed(body), 0.0).actions if isinstance(a, Apply)}
    # ... and a multi-node role's PodGroups and pods, where the Workload API is served.
    body["spec"]["prefill"]["tensorParallelSize"] = 2
    body["spec"]["prefill"]["multiNode"] = {"nodes": 2, "layout": "TensorParallel"}
    grouped = Observed(body, workload_api="scheduling.k8s.io/v1beta1")
    applied |= {a.kind for a in decide(grouped, 0.0).actions if isinstance(a, Apply)}
    assert applied == {k.kind for k in kinds.WATCHED}
    for kind in applied:
        assert {"create", "patch"} <= kinds.BY_KIND[kind].verbs, kind
    for k in kinds.WATCHED:
        assert {"list", "watch"} <= k.verbs and k.namespaced, k.kind


def _served_paths() -> set[str]:
    """Every REST path the Kubernetes client's generated APIs call, `{namespace}` and all."""
    package = Path(kubernetes.client.api.__file__).parent
    return {
        m.group(1)
        for source in package.glob("*.py")
        for m in re.finditer(r"resource_path='([^']+)'", source.read_text())
    }


@pytest.mark.parametrize("kind", [*kinds.KINDS, *kinds.KOPF], ids=lambda k: k.kind)
def test_paths_are_the_api_servers(kind: kinds.Kind) -> None:
    ours = {
        kinds.PDDEPLOYMENT: "pdmtp.io_pddeployments.yaml",
        kinds.ROLE_SCALE: "pdmtp.io_pdrolescales.yaml",
    }
    if kind in ours:
        crd = yaml.safe_load((REPO / "crds" / ours[kind]).read_text())["spec"]
        (version,) = crd["versions"]
        assert (crd["group"], version["name"], crd["names"]["plural"], crd["names"]["kind"]) == (
            kind.group,
            kind.version,
            kind.plural,
            kind.kind,
        )
        assert crd["scope"] == "Namespaced" and "status" in version["subresources"]
        return
    served = _served_paths()

    def template(p: str) -> str:
        return p.replace("/NS/", "/{namespace}/").replace("/NAME", "/{name}")

    wanted = [kind.path(None), template(kind.path("NS", "NAME"))]
    if kind.namespaced:
        wanted.append(template(kind.path("NS")))
    if kind.status_verbs:
        wanted.append(template(kind.path("NS", "NAME", "status")))
    for path in wanted:
        assert path in served, path
