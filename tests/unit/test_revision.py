"""Which changes start a paired rollout, which roll one role, which roll nothing."""

from __future__ import annotations

import pytest
from builders import PDDBuilder, pdd
from pdmtp.core.revision import compat_revision, role_hash


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
