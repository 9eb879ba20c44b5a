"""Which changes start a paired rollout, which roll one role, which roll nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import PDDBuilder, compat_revision, pdd
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.core.revision import role_hash

REPO = Path(__file__).resolve().parents[2]


def base() -> PDDBuilder:
    return pdd().mtp(3, modules=3).prefill(replicas=2, tp=4).decode(replicas=2, tp=4)


def revision(b: PDDBuilder) -> str:
    return compat_revision(b.build().spec)


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.mtp(2, modules=3),
        lambda b: b.mtp(3, modules=4),
        lambda b: b.set(image="pdmtp-engine:other"),
        lambda b: b.engine(blockSize=32),
        lambda b: b.engine(kvCacheDtype="fp8"),
        lambda b: b.engine(extraArgs=["--enforce-eager"]),
        lambda b: b.rdma("mlx5_0"),
        lambda b: b.prefill(tp=8),
        lambda b: b.decode(k=2),
    ],
)
def test_cross_role_changes_move_the_compat_revision(change: object) -> None:
    assert revision(change(base())) != revision(base())  # type: ignore[operator]


def test_an_override_equal_to_the_shared_k_is_no_change() -> None:
    assert revision(base().decode(k=3)) == revision(base())


@pytest.mark.parametrize(
    ("role", "change"),
    [
        ("decode", lambda b: b.decode(resources={"requests": {"cpu": "4"}})),
        ("prefill", lambda b: b.prefill(extra_args=["--max-num-seqs", "8"])),
        ("decode", lambda b: b.decode(env=[{"name": "X", "value": "1"}])),
        ("prefill", lambda b: b.prefill(nodeSelector={"pool": "h200"})),
        ("decode", lambda b: b.decode(podAnnotations={"a": "b"})),
        ("router", lambda b: b.router(policy="random")),
    ],
)
def test_role_local_changes_roll_only_that_role(role: str, change: object) -> None:
    changed = change(base())  # type: ignore[operator]
    assert revision(changed) == revision(base())
    for r in ("prefill", "decode", "router"):
        moved = role_hash(changed.build().spec, r) != role_hash(base().build().spec, r)
        assert moved is (r == role), r


def test_replicas_are_in_no_hash() -> None:
    scaled = base().prefill(replicas=7).decode(replicas=9).router(replicas=3)
    assert revision(scaled) == revision(base())
    for r in ("prefill", "decode", "router"):
        assert role_hash(scaled.build().spec, r) == role_hash(base().build().spec, r)


def test_rollout_policy_is_in_no_hash() -> None:
    assert revision(base().rollout(maxSurge=3, drainSeconds=5)) == revision(base())


def test_revision_is_a_short_stable_hex_string() -> None:
    r = revision(base())
    assert len(r) == 8 and int(r, 16) >= 0
    assert revision(base()) == r


# Recorded with the operator before spec.model.source, env valueFrom/envFrom, spec.pod,
# spec.placement and per-role kvTransfer existed: a spec that uses none of them must hash the
# same, or upgrading the operator would roll every PDDeployment.
RECORDED = {
    "minimal": ["8edcf70b", "f881eb11", "f881eb11", "7bd0464c"],
    "full": ["27d46688", "1b15b3ed", "e17c9951", "e3fe8ed5"],
    "demo": ["cfd8dbdc", "25451bcc", "25451bcc", "7bd0464c"],
}


def _hashes(spec: Any) -> list[str]:
    return [compat_revision(spec)] + [role_hash(spec, r) for r in ("prefill", "decode", "router")]


@pytest.mark.parametrize("sample", sorted(RECORDED))
def test_hashes_survive_operator_upgrades(sample: str) -> None:
    doc = yaml.safe_load((REPO / "samples" / f"{sample}.yaml").read_text())
    assert _hashes(PDDeployment.model_validate(doc).spec) == RECORDED[sample]


def test_builder_hashes_survive_operator_upgrades() -> None:
    b = pdd("x").mtp(3, modules=3)
    b.prefill(env=[{"name": "A", "value": "1"}, {"name": "B"}], nodeSelector={"rack": "a"})
    assert _hashes(b.build().spec) == ["8c70ee5b", "c69ded2d", "f881eb11", "7bd0464c"]


def test_weights_are_compat_scheduling_is_role_local() -> None:
    base = pdd("x").mtp(3, modules=3)
    start = _hashes(base.build().spec)
    pvc = {"pvc": {"claimName": "weights", "subPath": "dsv3"}}
    weights = pdd("x").mtp(3, modules=3)
    weights.spec["model"]["source"] = pvc
    assert _hashes(weights.build().spec)[0] != start[0], "a new weights source is a paired roll"
    other = pdd("x").mtp(3, modules=3)
    other.spec["model"]["source"] = {"pvc": {"claimName": "weights", "subPath": "dsv3-0324"}}
    assert _hashes(other.build().spec)[0] not in (start[0], _hashes(weights.build().spec)[0])
    token = pdd("x").mtp(3, modules=3)
    token.spec["model"]["source"] = {"hub": {"tokenSecretRef": {"name": "hf", "key": "token"}}}
    assert _hashes(token.build().spec)[0] != start[0]

    scheduling = [
        {"pod": {"priorityClassName": "inference-high"}},
        {"pod": {"imagePullSecrets": [{"name": "reg"}]}},
        {"pod": {"affinity": {"nodeAffinity": {}}}},
        {"placement": {"topologyKey": "example.com/rack"}},
    ]
    for change in scheduling:
        b = pdd("x").mtp(3, modules=3).set(**change)
        hashes = _hashes(b.build().spec)
        assert hashes[0] == start[0], change
        assert hashes[1] != start[1] and hashes[2] != start[2], change
    # A role's own override rolls that role only.
    b = pdd("x").mtp(3, modules=3).prefill(pod={"schedulerName": "gang"})
    hashes = _hashes(b.build().spec)
    assert (hashes[0], hashes[2]) == (start[0], start[2]) and hashes[1] != start[1]
    b = pdd("x").mtp(3, modules=3).decode(kvTransfer={"deviceNames": ["mlx5_1"]})
    hashes = _hashes(b.build().spec)
    assert (hashes[0], hashes[1]) == (start[0], start[1]) and hashes[2] != start[2]
    # Secrets by reference in env: role-local too.
    ref = {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    b = pdd("x").mtp(3, modules=3).decode(env=[ref])
    assert _hashes(b.build().spec)[0] == start[0]
