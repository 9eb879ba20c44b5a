"""Agreement rules (docs/design.md, "What both roles must agree on") and the lookahead formula
("Why pdmtp exists")."""

from __future__ import annotations

import pytest
from builders import pdd
from hypothesis import assume, given
from hypothesis import strategies as st
from pdmtp.api import reasons
from pdmtp.api.flags import OWNED_FLAGS, owned_flag, owned_flags_in
from pdmtp.core.agreement import check
from pdmtp.core.lookahead import (
    LOOKAHEAD_METHODS,
    MTP_METHOD_ALIASES,
    normalise_method,
    prefill_backoff,
    prefill_lookahead,
)


@pytest.mark.parametrize(
    ("method", "k", "modules", "expected"),
    [
        (None, 3, 3, 0),
        ("ngram", 4, 1, 0),
        ("draft_model", 3, 1, 0),
        ("eagle", 1, 1, 1),
        ("eagle", 5, 1, 1),
        ("eagle3", 3, 4, 1),
        ("dflash", 3, 1, 1),
        ("mtp", 1, 1, 1),
        ("mtp", 3, 1, 1),  # single-module MTP: 1 whatever k is
        ("mtp", 1, 3, 1),  # min(modules, k) == 1
        ("mtp", 2, 2, 2),
        ("mtp", 3, 3, 3),
        ("mtp", 3, 8, 3),
        ("mtp", 5, 2, 5),  # multi-module: the lookahead is k, not the module count
        ("deepseek_mtp", 3, 3, 3),
        ("qwen3_next_mtp", 2, 4, 2),
        ("inkling_mtp", 4, 4, 4),
    ],
)
def test_lookahead_formula(method: str | None, k: int, modules: int, expected: int) -> None:
    assert prefill_lookahead(method, k, modules) == expected


def test_every_alias_normalises_to_mtp() -> None:
    assert all(normalise_method(m) == "mtp" for m in MTP_METHOD_ALIASES)
    assert normalise_method("eagle") == "eagle" and normalise_method(None) is None
    assert "mtp" in LOOKAHEAD_METHODS


@given(st.integers(0, 16), st.integers(0, 1))
def test_backoff_is_the_larger_of_state_and_lookahead_minus_one(look: int, state: int) -> None:
    assert prefill_backoff(look, state) == max(state, look - 1)
    assert prefill_backoff(look, state) >= 0


def test_samples_shape_is_compatible() -> None:
    a = check(pdd().mtp(3, modules=3).build().spec)
    assert a.compatible and (a.prefill_lookahead, a.decode_lookahead, a.prefill_backoff) == (
        3,
        3,
        2,
    )


def test_no_speculation_means_no_lookahead() -> None:
    a = check(pdd().no_speculation().build().spec)
    assert a.compatible and (a.prefill_lookahead, a.prefill_backoff) == (0, 0)


def test_state_backoff_survives_dense_lookahead() -> None:
    a = check(pdd().no_speculation().engine(stateBackoff=1).build().spec)
    assert a.prefill_backoff == 1


def test_single_module_mtp_lets_k_differ() -> None:
    a = check(pdd().mtp(1, modules=1).prefill(k=3).decode(k=1).build().spec)
    assert a.compatible and a.prefill_lookahead == a.decode_lookahead == 1


def test_eagle_lets_k_differ_even_without_module_count() -> None:
    spec = (
        pdd()
        .mtp(2, method="eagle")
        .set(speculative={"method": "eagle", "numSpeculativeTokens": 2, "draftModel": "org/draft"})
    )
    a = check(spec.prefill(k=4).build().spec)
    assert a.compatible and a.prefill_lookahead == a.decode_lookahead == 1


def test_multi_module_mtp_with_different_k_is_a_mismatch() -> None:
    a = check(pdd().mtp(3, modules=3).prefill(k=2).build().spec)
    assert not a.compatible
    (finding,) = a.findings
    assert finding.reason == reasons.LOOKAHEAD_MISMATCH
    assert "lookahead 2" in finding.message and "derives 3" in finding.message
    assert a.prefill_backoff is None


def test_unknown_module_count_with_different_k_cannot_be_proven() -> None:
    a = check(pdd().mtp(3).prefill(k=2).build().spec)
    (finding,) = a.findings
    assert finding.reason == reasons.MTP_MODULES_UNKNOWN
    assert "spec.model.mtpModules" in finding.message
    assert (a.prefill_lookahead, a.decode_lookahead) == (None, None)


def test_unknown_module_count_with_equal_k_agrees_without_a_number() -> None:
    a = check(pdd().mtp(3).build().spec)
    assert a.compatible
    assert (a.prefill_lookahead, a.decode_lookahead, a.prefill_backoff) == (None, None, None)


@pytest.mark.parametrize(
    ("tp_p", "tp_d", "ok"),
    [(8, 4, True), (4, 8, True), (2, 2, True), (6, 4, False), (3, 2, False), (1, 7, True)],
)
def test_tensor_parallel_sizes_must_divide(tp_p: int, tp_d: int, ok: bool) -> None:
    a = check(pdd().prefill(tp=tp_p).decode(tp=tp_d).build().spec)
    assert a.compatible is ok
    if not ok:
        assert a.findings[0].reason == reasons.TENSOR_PARALLEL_INDIVISIBLE
        assert "spec.prefill.tensorParallelSize" in a.findings[0].message


def test_decode_context_must_cover_the_prefill() -> None:
    a = check(pdd().engine(maxModelLen=8192).decode(maxModelLen=4096).build().spec)
    assert [f.reason for f in a.findings] == [reasons.MAX_MODEL_LEN_MISMATCH]
    assert check(pdd().engine(maxModelLen=4096).decode(maxModelLen=8192).build().spec).compatible


def test_role_override_without_shared_speculation() -> None:
    a = check(pdd().no_speculation().prefill(k=2).build().spec)
    assert reasons.SPECULATIVE_OVERRIDE_WITHOUT_METHOD in [f.reason for f in a.findings]


def test_eagle_needs_a_draft_model() -> None:
    a = check(pdd().mtp(2, method="eagle3").build().spec)
    assert [f.reason for f in a.findings] == [reasons.DRAFT_MODEL_MISSING]


@pytest.mark.parametrize(
    ("k", "modules", "ok"),
    [(3, 3, True), (2, 3, True), (6, 3, True), (4, 3, False), (5, 2, False), (4, 2, True)],
)
def test_more_draft_tokens_than_modules_must_be_a_multiple(k: int, modules: int, ok: bool) -> None:
    a = check(pdd().mtp(k, modules=modules).build().spec)
    assert a.compatible is ok
    if not ok:
        # Both roles run the same k here: one finding per role.
        assert [f.reason for f in a.findings] == [reasons.SPECULATIVE_TOKENS_INDIVISIBLE] * 2
        assert "spec.prefill" in a.findings[0].message


def test_rdma_needs_devices() -> None:
    assert [f.reason for f in check(pdd().rdma().build().spec).findings] == [
        reasons.RDMA_DEVICES_MISSING
    ]
    assert check(pdd().rdma("mlx5_0").build().spec).compatible


@pytest.mark.parametrize("where", ["engine", "prefill", "decode"])
@pytest.mark.parametrize(
    "arg",
    [
        "--speculative-config={}",
        "--kv_transfer_config",
        "--model",
        "--block-size=32",
        "--kv-cache-dtype",
        "--dtype=half",
        "--tensor-parallel-size",
        "-tp",
        "--port=1",
    ],
)
def test_owned_flags_in_extra_args_are_rejected(where: str, arg: str) -> None:
    b = pdd()
    if where == "engine":
        b.engine(extraArgs=["--enforce-eager", arg])
    else:
        getattr(b, where)(extra_args=[arg])
    (finding,) = check(b.build().spec).findings
    assert finding.reason == reasons.OWNED_FLAG_IN_EXTRA_ARGS
    assert f"spec.{where}.extraArgs" in finding.message


@pytest.mark.parametrize(
    "arg", ["--enforce-eager", "--max-num-seqs=8", "--model-impl", "--portable", "8", "--ports"]
)
def test_free_flags_pass(arg: str) -> None:
    assert owned_flag(arg) is None


def test_owned_flags_are_reported_once_in_order() -> None:
    assert owned_flags_in(["--dtype", "x", "--model", "--dtype=half"]) == ["--dtype", "--model"]
    assert set(OWNED_FLAGS) >= {"--speculative-config", "--kv-transfer-config"}


def test_findings_accumulate_in_a_stable_order() -> None:
    spec = pdd().mtp(3, modules=3).prefill(k=2, tp=3, extra_args=["--model"]).decode(tp=2)
    found = [f.reason for f in check(spec.rdma().build().spec).findings]
    assert found == [
        reasons.LOOKAHEAD_MISMATCH,
        reasons.TENSOR_PARALLEL_INDIVISIBLE,
        reasons.RDMA_DEVICES_MISSING,
        reasons.OWNED_FLAG_IN_EXTRA_ARGS,
    ]


@given(
    k_p=st.integers(1, 8),
    k_d=st.integers(1, 8),
    modules=st.none() | st.integers(1, 8),
    method=st.sampled_from(sorted(MTP_METHOD_ALIASES | {"eagle"})),
)
def test_compatible_means_both_roles_derive_the_same_lookahead(
    k_p: int, k_d: int, modules: int | None, method: str
) -> None:
    b = pdd().mtp(1, modules=modules, method=method).prefill(k=k_p).decode(k=k_d)
    if method == "eagle":
        b.set(speculative={"method": "eagle", "numSpeculativeTokens": 1, "draftModel": "d"})
    a = check(b.build().spec)
    # Only the lookahead rules are under test here (vLLM's divisibility rule has its own test).
    assume(all(f.reason != reasons.SPECULATIVE_TOKENS_INDIVISIBLE for f in a.findings))
    real_modules = modules if modules is not None else 1
    truths = {
        m: (prefill_lookahead(method, k_p, m), prefill_lookahead(method, k_d, m))
        for m in ([modules] if modules is not None else range(1, 9))
    }
    if a.compatible:
        # Whatever the checkpoint's real module count, both roles derive the same number.
        assert all(p == d for p, d in truths.values())
    else:
        assert any(p != d for p, d in truths.values())
    if a.prefill_lookahead is not None:
        assert a.prefill_lookahead == prefill_lookahead(method, k_p, real_modules)
