"""Specs that parse but cannot work as written (issue 29) are refused offline with the words of
the CRD's CEL rule, and their valid neighbours are accepted. The same rules' CEL side is proved
against a real API server by tests/cluster/test_pod_admission.py (docs/validation-corpus.md)."""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import Any

import pytest
from builders import PDDBuilder, pdd
from hypothesis import given, settings
from hypothesis import strategies as st
from pdmtp.api import rules
from pdmtp.api.autoscaling import BAND_SLACK, band_reachable
from pdmtp.api.flags import owned_flag
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.core.rollout import planner
from pdmtp.core.rollout.invariants import InvariantMonitor
from pdmtp.core.rollout.planner import Policy, Target
from pdmtp.core.validation import validate
from pdmtp.tools.simulate import SimCluster, simulate_rollout

Doc = dict[str, Any]


def base() -> PDDBuilder:
    return pdd("x").mtp(3, modules=3)


def refused(doc: Doc, words: str) -> None:
    verdict = validate(doc)
    assert not verdict.usable, "accepted"
    assert words in verdict.message(), verdict.message()


def accepted(doc: Doc) -> None:
    verdict = validate(doc)
    assert verdict.compatible, verdict.message()


def with_autoscaling(builder: PDDBuilder, **auto: Any) -> Doc:
    return builder.set(autoscaling=auto).dict()


def decode_auto(**fields: Any) -> dict[str, Any]:
    return {"minReplicas": 1, "maxReplicas": 4, **fields}


TOKENS = {"signal": "decodeTokensPerSecondPerPod", "value": 2000}

# ---- autoscaling that can never work -----------------------------------------------------------


def test_an_empty_target_list_is_refused_and_an_omitted_one_takes_the_defaults() -> None:
    refused(with_autoscaling(base(), decode=decode_auto(targets=[])), "targets is empty")
    accepted(with_autoscaling(base(), decode=decode_auto()))


@pytest.mark.parametrize(("value", "ok"), [(80, False), (1.0001, False), (1, True), (0.8, True)])
def test_kv_cache_usage_is_a_fraction(value: float, ok: bool) -> None:
    doc = with_autoscaling(
        base(), decode=decode_auto(targets=[{"signal": "kvCacheUsage", "value": value}])
    )
    if ok:
        accepted(doc)
    else:
        refused(doc, "kvCacheUsage is a fraction of the KV cache (0..1")


def test_a_per_pod_count_may_exceed_one() -> None:
    target = {"signal": "runningRequestsPerPod", "value": 32}
    accepted(with_autoscaling(base(), decode=decode_auto(targets=[target])))


@pytest.mark.parametrize(
    ("spec_k", "decode_k", "acceptance", "ok"),
    [
        (3, None, 3.5, False),
        (3, None, 3.0, True),
        (3, None, 0.0, True),
        (3, 2, 2.5, False),  # the decode's own override is its k
        (1, 3, 2.5, True),  # an override above spec.speculative's
    ],
)
def test_expected_acceptance_cannot_exceed_the_decode_roles_k(
    spec_k: int, decode_k: int | None, acceptance: float, ok: bool
) -> None:
    builder = pdd("x").mtp(spec_k, modules=3)
    if decode_k is not None:
        builder = builder.prefill(k=decode_k).decode(k=decode_k)
    doc = with_autoscaling(
        builder, decode=decode_auto(targets=[TOKENS], expectedAcceptanceLength=acceptance)
    )
    if ok:
        accepted(doc)
    else:
        refused(doc, "it cannot exceed the decode role's numSpeculativeTokens")


@pytest.mark.parametrize(
    "prefill",
    [
        {"targets": [TOKENS], "expectedAcceptanceLength": 1.5},
        {"expectedAcceptanceLength": 1.5},
    ],
)
def test_spec_decode_signals_on_the_prefill_are_refused(prefill: dict[str, Any]) -> None:
    doc = with_autoscaling(base(), prefill={"minReplicas": 1, "maxReplicas": 2, **prefill})
    refused(doc, "which a prefill pod never moves")


def test_spec_decode_signals_need_speculative_decoding() -> None:
    decode = decode_auto(targets=[TOKENS], expectedAcceptanceLength=1.5)
    refused(
        with_autoscaling(pdd("x").no_speculation(), decode=decode),
        "an engine without speculative decoding (spec.speculative unset) does not export",
    )
    accepted(with_autoscaling(base(), decode=decode))
    accepted(with_autoscaling(pdd("x").no_speculation(), decode=decode_auto()))


@pytest.mark.parametrize(
    ("interval", "stale", "ok"), [(30, 20, False), (30, 30, False), (30, 31, True), (15, 60, True)]
)
def test_the_staleness_window_outlasts_the_interval(interval: int, stale: int, ok: bool) -> None:
    doc = with_autoscaling(
        base(), decode=decode_auto(), intervalSeconds=interval, staleAfterSeconds=stale
    )
    if ok:
        accepted(doc)
    else:
        refused(doc, "spec.autoscaling.staleAfterSeconds must be greater than intervalSeconds")


def test_the_default_staleness_and_interval_hold() -> None:
    accepted(with_autoscaling(base(), decode=decode_auto()))


# ---- arithmetic: the band in exact decimals ----------------------------------------------------


def band_doc(prefill: int, d_low: int, d_high: int, low: float, high: float) -> Doc:
    return with_autoscaling(
        base().prefill(replicas=prefill),
        decode={"minReplicas": d_low, "maxReplicas": d_high},
        ratio={"min": low, "max": high},
    )


def test_a_band_binary_floating_point_misses_is_reached_exactly() -> None:
    # 7 prefill : 100 decode is 0.07 exactly; in binary 0.07 * 100 is 7.000000000000001.
    assert math.ceil(0.07 * 100) == 8  # what the old check computed: no prefill count fits
    doc = band_doc(7, 100, 100, 0.07, 1)
    accepted(doc)
    assert band_reachable(PDDeployment.model_validate(doc).spec)


def brute_force(p: tuple[int, int], d: tuple[int, int], low: Fraction, high: Fraction) -> bool:
    return any(
        low <= Fraction(prefill, decode) <= high
        for prefill in range(p[0], p[1] + 1)
        for decode in range(d[0], d[1] + 1)
    )


milli = st.integers(1, 3000).map(lambda n: n / 1000)


@settings(max_examples=300, deadline=None)
@given(
    p=st.tuples(st.integers(1, 12), st.integers(0, 12)),
    d=st.tuples(st.integers(1, 120), st.integers(0, 12)),
    band=st.tuples(milli, milli).map(sorted),
)
def test_band_reachable_is_every_pair_checked_exactly(
    p: tuple[int, int], d: tuple[int, int], band: list[float]
) -> None:
    prefill, decode = (p[0], p[0] + p[1]), (d[0], d[0] + d[1])
    doc = with_autoscaling(
        base(),
        prefill={"minReplicas": prefill[0], "maxReplicas": prefill[1]},
        decode={"minReplicas": decode[0], "maxReplicas": decode[1]},
        ratio={"min": band[0], "max": band[1]},
    )
    low, high = Fraction(repr(band[0])), Fraction(repr(band[1]))
    verdict = validate(doc)
    assert verdict.usable == brute_force(prefill, decode, low, high), verdict.message()


def cel_interval(p: tuple[int, int], d: tuple[int, int], low: float, high: float) -> bool:
    """BAND_REACHABLE_RULE's CEL, in the same IEEE doubles the API server computes with."""
    return (
        low * float(d[0]) <= float(p[1]) + BAND_SLACK
        and float(p[0]) <= high * float(d[1]) + BAND_SLACK
    )


@settings(max_examples=500, deadline=None)
@given(
    p=st.tuples(st.integers(1, 1000), st.integers(1, 1000)).map(sorted),
    d=st.tuples(st.integers(1, 1000), st.integers(1, 1000)).map(sorted),
    band=st.tuples(st.integers(1, 10**6), st.integers(1, 10**6)).map(sorted),
)
def test_the_cel_interval_check_is_exact_for_six_decimals(
    p: list[int], d: list[int], band: list[int]
) -> None:
    # Ratios of up to 6 decimals (the schema's 0.001..1000 in millionths): the slack absorbs
    # the doubles' rounding and never admits an interval the exact decimals miss.
    low, high = Fraction(band[0], 10**6), Fraction(band[1], 10**6)
    exact = low * d[0] <= p[1] and p[0] <= high * d[1]
    as_written = (float(repr(band[0] / 10**6)), float(repr(band[1] / 10**6)))
    assert cel_interval((p[0], p[1]), (d[0], d[1]), *as_written) == exact


def test_the_cel_interval_check_takes_the_float_case() -> None:
    assert 0.07 * 100.0 > 7.0  # the double product the old rule compared
    assert cel_interval((7, 7), (100, 100), 0.07, 1.0)


# ---- rendered objects the server or kubelet would refuse ---------------------------------------


@pytest.mark.parametrize(
    ("resources", "ok"),
    [
        ({"requests": {"cpu": "4"}, "limits": {"cpu": 2}}, False),
        ({"requests": {"memory": "2Gi"}, "limits": {"memory": "2000Mi"}}, False),
        ({"requests": {"cpu": "2"}, "limits": {"cpu": "2000m"}}, True),
        ({"requests": {"cpu": 1}, "limits": {"memory": "1Gi"}}, True),
        ({"requests": {"memory": "8Ei"}, "limits": {"memory": "8Ei"}}, True),
    ],
)
@pytest.mark.parametrize("where", ["decode", "router"])
def test_requests_never_exceed_limits(where: str, resources: Doc, ok: bool) -> None:
    builder = base()
    builder = builder.router(resources=resources) if where == "router" else builder
    builder = builder.decode(resources=resources) if where == "decode" else builder
    if ok:
        accepted(builder.dict())
    else:
        refused(builder.dict(), "resources.requests must not exceed resources.limits")


@pytest.mark.parametrize("field", ["requests", "limits"])
def test_the_router_takes_no_gpu(field: str) -> None:
    doc = base().router(resources={field: {"nvidia.com/gpu": 1}}).dict()
    refused(doc, "spec.router.resources must not ask for nvidia.com/gpu")
    accepted(base().router(resources={field: {"cpu": 1}}).dict())


def with_mount(path: str) -> Doc:
    return (
        base()
        .set(
            pod={
                "volumes": [{"name": "data", "emptyDir": {}}],
                "volumeMounts": [{"name": "data", "mountPath": path}],
            }
        )
        .dict()
    )


@pytest.mark.parametrize(
    "path",
    [
        "//models",
        "/cache/../models",
        "/",
        "/data/./x",
        "/data/..",
        "models",
        "/models/",
        "/dev/shm",
    ],
)
def test_mount_paths_are_normalised_before_the_reserved_paths(path: str) -> None:
    refused(with_mount(path), "mountPath must be absolute and normalised")


@pytest.mark.parametrize("path", ["/data", "/data/", "/a..b", "/srv/models", "/.cache"])
def test_normalised_mount_paths_are_taken(path: str) -> None:
    accepted(with_mount(path))


WEIGHTS = "names the operator's volume 'model'"


@pytest.mark.parametrize(
    ("source", "volume", "ok"),
    [
        (None, "model", False),
        ({"hub": {}}, "model", False),
        ({"pvc": {"claimName": "w"}}, "model", True),
        ({"image": {"reference": "example.com/w:1"}}, "model", True),
        ({"hub": {}}, "hf-cache", False),
        ({"hub": {"cachePvc": {"claimName": "c"}}}, "hf-cache", True),
        ({"pvc": {"claimName": "w"}}, "hf-cache", False),
        (None, "dshm", True),
    ],
)
@pytest.mark.parametrize("where", ["shared", "role"])
def test_a_mount_of_an_operator_volume_needs_the_source_that_creates_it(
    source: Doc | None, volume: str, ok: bool, where: str
) -> None:
    builder = base()
    if source is not None:
        builder.spec["model"]["source"] = source
    mount = {"volumeMounts": [{"name": volume, "mountPath": "/w"}]}
    builder = builder.set(pod=mount) if where == "shared" else builder.decode(pod=mount)
    if ok:
        accepted(builder.dict())
    else:
        refused(builder.dict(), "that this spec's model source does not create")


@pytest.mark.parametrize("source", ["pvc", "image"])
@pytest.mark.parametrize(
    ("sub_path", "ok"),
    [("../etc", False), ("a/../../b", False), ("/abs", False), ("a..b", True), ("llama/8b", True)],
)
def test_sub_paths_are_checked_alike_on_both_weights_sources(
    source: str, sub_path: str, ok: bool
) -> None:
    where = {"claimName": "w"} if source == "pvc" else {"reference": "example.com/w:1"}
    builder = base()
    builder.spec["model"]["source"] = {source: {**where, "subPath": sub_path}}
    if ok:
        accepted(builder.dict())
    else:
        refused(
            builder.dict(),
            f"spec.model.source.{source}.subPath is a relative path inside the volume",
        )


def test_patterns_are_read_as_cel_reads_them_a_final_newline_does_not_match() -> None:
    assert rules.matches(rules.DNS_1035_LABEL)("demo")
    assert not rules.matches(rules.DNS_1035_LABEL)("demo\n")
    refused(pdd("demo\n").dict(), "metadata.name must be a DNS-1035")
    refused(base().decode(nodeSelector={"rack": "a\n"}).dict(), "nodeSelector values")
    with pytest.raises(ValueError):
        rules.quantity("1\n")
    sized = base().set(pod={"volumes": [{"name": "d", "emptyDir": {"sizeLimit": "1Gi\n"}}]})
    refused(sized.dict(), "spec.pod.volumes[0].emptyDir.sizeLimit: Invalid value")
    assert owned_flag("--block-size\n") is None  # CEL's matches does not take it either
    assert owned_flag("--block-size") == "--block-size"


@pytest.mark.parametrize(
    "args",
    [["--api-key", "sk-1"], ["--api-key=sk-1"], ["--hf-token=hf_x"], ["--HF_TOKEN", "x"]],
)
@pytest.mark.parametrize("where", ["engine", "decode"])
def test_credentials_in_extra_args_are_refused(args: list[str], where: str) -> None:
    builder = base()
    builder = (
        builder.engine(extraArgs=args) if where == "engine" else builder.decode(extra_args=args)
    )
    refused(builder.dict(), "extraArgs must not carry credentials")


@pytest.mark.parametrize(
    "arg",
    ["--max-num-batched-tokens=8192", "--tokenizer=x", "--ssl-keyfile=/k", "--enable-lora"],
)
def test_flags_without_a_credential_word_are_taken(arg: str) -> None:
    accepted(base().decode(extra_args=[arg]).dict())


# ---- rollout settings that silently do something else ------------------------------------------

CANARY = "spec.rollout.canary: with maxSurge 0 the new and the old revision share"


def canary_doc(prefill: int, decode: int, percent: int, surge: int) -> Doc:
    return (
        base()
        .prefill(replicas=prefill)
        .decode(replicas=decode)
        .rollout(maxSurge=surge, maxUnavailable=1, canary={"percent": percent})
        .dict()
    )


def planner_holds(prefill: int, decode: int, percent: int, surge: int) -> bool:
    """The planner's own simulation: does the rollout stop at a canary hold (both revisions
    serving), or run in full?"""
    old, new = Target("aaaa", prefill, decode, 1), Target("bbbb", prefill, decode, 1)
    policy = Policy(max_surge=surge, max_unavailable=1, drain_seconds=0)
    sim = SimCluster.serving("aaaa", old)
    canary = Policy(surge, 1, 0, canary_percent=percent)
    trace = simulate_rollout(
        sim, InvariantMonitor(policy), new, random.Random(7), policy=canary, max_ticks=400,
        until=lambda step: step.outcome == "Held",
    )  # fmt: skip
    return not trace.complete and trace.steps[-1][2].outcome == "Held"


GRID = [
    (prefill, decode, percent, surge)
    for prefill in (1, 2, 3, 4)
    for decode in (1, 2, 4)
    for percent in (1, 34, 50, 51, 67, 75, 99)
    for surge in (0, 1)
]


@pytest.mark.parametrize(("prefill", "decode", "percent", "surge"), GRID)
def test_the_canary_rule_refuses_exactly_what_the_planner_cannot_hold(
    prefill: int, decode: int, percent: int, surge: int
) -> None:
    doc = canary_doc(prefill, decode, percent, surge)
    holds = planner_holds(prefill, decode, percent, surge)
    if holds:
        accepted(doc)
    else:
        refused(doc, CANARY)


def test_the_canary_rule_reads_an_autoscaled_roles_minimum() -> None:
    doc = canary_doc(2, 2, 50, 0)
    accepted(doc)
    doc["spec"]["autoscaling"] = {"decode": {"minReplicas": 1, "maxReplicas": 4}}
    refused(doc, CANARY)
    doc["spec"]["autoscaling"]["decode"]["minReplicas"] = 2
    accepted(doc)


def test_a_canary_that_cannot_hold_runs_in_full() -> None:
    # Why the rule: one-pod roles with maxSurge 0 leave the old revision no pod beside the
    # canary's, and the planner degrades to a plain rollout.
    assert not planner_holds(1, 1, 50, 0)
    assert planner.canary_replicas(Target("b", 1, 1, 1), 50) == {"prefill": 1, "decode": 1}
    assert planner_holds(2, 2, 50, 0)
