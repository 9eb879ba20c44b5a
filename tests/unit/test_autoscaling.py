"""The elastic P/D decision (pdmtp.core.scaling.autoscaler) and the /metrics reader
(pdmtp.core.promtext).

Worked examples first (each behaviour on numbers you can check by hand), then properties over
arbitrary inputs, then long simulated runs that count decisions.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pdmtp.api.autoscaling import (
    DECODE_TARGETS,
    MTP_DECODE_TARGETS,
    PREFILL_TARGETS,
    SCALE_DOWN,
    SCALE_UP,
    TOLERANCE,
    AutoscalingSpec,
    Behavior,
    RatioBand,
    RoleAutoscaling,
    ScalingRules,
    SignalTarget,
)
from pdmtp.api.vocabulary import ENGINE_ROLES, EngineRole
from pdmtp.core.promtext import parse_scrape, samples
from pdmtp.core.scaling.autoscaler import (
    Coverage,
    Evaluation,
    HistogramTotals,
    PodObservation,
    Recommendation,
    RoleHistory,
    ScaleEvent,
    Scrape,
    Signal,
    evaluate,
)
from pydantic import ValidationError

T = TypeVar("T")
NOW = 10_000.0


def both(prefill: T, decode: T) -> dict[EngineRole, T]:
    return {"prefill": prefill, "decode": decode}


EMPTY = both(RoleHistory(), RoleHistory())

# Quick rules for examples: react at once; 1000 pods a period (the API's largest count) is no
# step limit. Tests that need behaviour set it.
INSTANT = ScalingRules(stabilization_window_seconds=0, max_pods=1000)


def role_policy(
    targets: dict[Signal, float],
    min_replicas: int = 1,
    max_replicas: int = 20,
    up: ScalingRules = INSTANT,
    down: ScalingRules = INSTANT,
    tolerance: float = 0.1,
    expected_acceptance_length: float | None = None,
) -> RoleAutoscaling:
    return RoleAutoscaling(
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        targets=[SignalTarget(signal=signal, value=value) for signal, value in targets.items()],
        behavior=Behavior(scale_up=up, scale_down=down),
        tolerance=tolerance,
        expected_acceptance_length=expected_acceptance_length,
    )


def scaling(spec: AutoscalingSpec, role: EngineRole) -> RoleAutoscaling:
    autoscaled = spec.role(role)
    assert autoscaled is not None
    return autoscaled


PREFILL_WAITING = role_policy({Signal.WAITING_PER_POD: 4.0})
DECODE_RUNNING = role_policy({Signal.RUNNING_PER_POD: 32.0})


def pods(
    count: int,
    at: float = NOW,
    ready: bool = True,
    previous: Scrape | None = None,
    **values: object,
) -> tuple[PodObservation, ...]:
    scrape = Scrape(at=at, **values)  # type: ignore[arg-type]
    return tuple(PodObservation(f"pod-{i}", ready, scrape, previous) for i in range(count))


def run(
    spec: AutoscalingSpec,
    prefill: Sequence[PodObservation],
    decode: Sequence[PodObservation],
    current: tuple[int, int],
    history: Mapping[EngineRole, RoleHistory] = EMPTY,
    now: float = NOW,
) -> Evaluation:
    return evaluate(spec, both(prefill, decode), both(*current), history, now)


def policy_of(
    prefill: RoleAutoscaling | None = PREFILL_WAITING,
    decode: RoleAutoscaling | None = DECODE_RUNNING,
    ratio: RatioBand | None = None,
) -> AutoscalingSpec:
    return AutoscalingSpec(prefill=prefill, decode=decode, ratio=ratio)


# ---------------------------------------------------------------------------------------------
# The /metrics reader

VLLM_METRICS = r"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="org/inkling"} 12.0
vllm:num_requests_running{engine="1",model_name="org/inkling"} 9.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="org/inkling"} 3.0
vllm:num_requests_waiting{engine="1",model_name="org/inkling"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="org/inkling"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="org/inkling"} 0.7
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="org/inkling"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="org/inkling"} 40.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="org/inkling"} 40.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="org/inkling"} 12.5
vllm:time_to_first_token_seconds_count{engine="1",model_name="org/inkling"} 10.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="org/inkling"} 2.5
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="org/inkling"} 100.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="org/inkling"} 2000.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="org/inkling"} 60.0
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_count{engine="0",model_name="org/inkling"} 50.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="org/inkling"} 5.0
vllm:request_queue_time_seconds_created{engine="0",model_name="org/inkling"} 1.7e+09
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="org/inkling"} 1000.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="org/inkling"} 1.7e+09
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="org/inkling"} 2100.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 900.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 700.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="org/inkling"} 4.0
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
"""


def test_the_reader_folds_a_realistic_vllm_page_into_one_scrape_per_pod() -> None:
    scrape = parse_scrape(VLLM_METRICS, at=42.0)
    assert scrape.at == 42.0
    assert scrape.running == 21.0  # two data-parallel engines: summed
    assert scrape.waiting == 3.0
    assert scrape.kv_cache_usage == pytest.approx(0.6)  # averaged over the engines
    assert scrape.time_to_first_token == HistogramTotals(15.0, 50.0)
    assert scrape.inter_token_latency == HistogramTotals(60.0, 2000.0)
    assert scrape.queue_time == HistogramTotals(5.0, 50.0)  # _created is not the count
    assert scrape.drafts == 1000.0
    assert scrape.accepted_tokens == 2100.0  # not confused with ..._per_pos_total


def test_the_reader_leaves_absent_metrics_none_and_skips_what_it_cannot_read() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{model_name="a} b \\"quoted\\" {x}"} 5 1700000000000',
            "vllm:num_requests_running NaN",
            'vllm:kv_cache_usage_perc{unterminated="oops} 0.9',
            "vllm:time_to_first_token_seconds_sum 3.0",  # no _count: no histogram
            "vllm:spec_decode_num_drafts 7",  # a counter without the _total suffix
            "garbage",
            "",
        ]
    )
    scrape = parse_scrape(text, at=1.0)
    assert scrape.waiting == 5.0  # label value with a brace, spaces and escaped quotes
    assert scrape.running is None
    assert scrape.kv_cache_usage is None
    assert scrape.time_to_first_token is None
    assert scrape.drafts == 7.0
    assert scrape == Scrape(at=1.0, waiting=5.0, drafts=7.0)
    assert parse_scrape("", at=0.0) == Scrape(at=0.0)


label_values = st.text(alphabet='ab }{",=\\\n', max_size=6)


@given(
    st.lists(
        st.tuples(label_values, st.floats(min_value=0, max_value=1e6, allow_nan=False)),
        min_size=1,
        max_size=5,
    )
)
def test_the_reader_sums_every_label_set_whatever_its_label_values(
    series: list[tuple[str, float]],
) -> None:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    text = "\n".join(
        f'vllm:num_requests_waiting{{model_name="{escape(label)}",engine="{i}"}} {value!r}'
        for i, (label, value) in enumerate(series)
    )
    assert [name for name, _ in samples(text)] == ["vllm:num_requests_waiting"] * len(series)
    waiting = parse_scrape(text, at=0.0).waiting
    assert waiting == pytest.approx(math.fsum(value for _, value in series))


# ---------------------------------------------------------------------------------------------
# Signals, tolerance and the deciding signal


@pytest.mark.parametrize("per_pod", [3.61, 3.8, 4.0, 4.2, 4.39])
def test_hysteresis_inside_the_tolerance_band_nothing_moves(per_pod: float) -> None:
    decision = run(policy_of(), pods(5, waiting=per_pod), pods(4, running=32.0), (5, 4))
    prefill = decision.roles["prefill"]
    assert prefill.desired == 5
    assert prefill.readings[0].within_tolerance
    assert "within tolerance" in prefill.reason
    assert not prefill.changed


@pytest.mark.parametrize(("per_pod", "desired"), [(4.5, 6), (8.0, 10), (3.5, 5), (1.0, 2)])
def test_outside_the_band_the_count_follows_observed_over_target(
    per_pod: float, desired: int
) -> None:
    decision = run(policy_of(), pods(5, waiting=per_pod), pods(4, running=32.0), (5, 4))
    assert decision.roles["prefill"].recommendation == desired
    assert decision.roles["prefill"].desired == desired
    assert decision.roles["prefill"].deciding_signal is Signal.WAITING_PER_POD


def test_the_largest_vote_decides_and_the_reason_names_it() -> None:
    decode = role_policy(
        {Signal.KV_CACHE_USAGE: 0.8, Signal.RUNNING_PER_POD: 32.0, Signal.INTER_TOKEN_LATENCY: 1.0}
    )
    decision = run(
        policy_of(decode=decode),
        pods(2, waiting=4.0),
        pods(4, running=40.0, kv_cache_usage=1.0),  # running wants 5, KV wants 5 too: KV further
        (2, 4),
    )
    result = decision.roles["decode"]
    assert result.desired == 5
    assert result.deciding_signal is Signal.KV_CACHE_USAGE
    assert "kvCacheUsage 1 vs target 0.8 wants 5" in result.reason
    by_signal = {reading.signal: reading for reading in result.readings}
    assert by_signal[Signal.RUNNING_PER_POD].value == 40.0
    assert by_signal[Signal.RUNNING_PER_POD].desired == 5
    # ITL has no previous scrape to make a window from: it does not vote, and it would hold a
    # scale-down (it cannot here: everything else asks for more).
    assert by_signal[Signal.INTER_TOKEN_LATENCY].coverage is Coverage.MISSING
    assert result.reason.startswith("decode scale up 4 -> 5: ")


def test_latency_signals_use_the_mean_between_two_scrapes_and_survive_an_engine_restart() -> None:
    prefill = role_policy({Signal.QUEUE_TIME: 0.5, Signal.TIME_TO_FIRST_TOKEN: 2.0})
    before = Scrape(
        at=NOW - 15,
        queue_time=HistogramTotals(100.0, 1000.0),
        time_to_first_token=HistogramTotals(500.0, 1000.0),
    )
    after = Scrape(
        at=NOW,
        queue_time=HistogramTotals(120.0, 1020.0),  # 20 requests queued 1 s each
        time_to_first_token=HistogramTotals(530.0, 1020.0),  # 1.5 s each
    )
    restarted = Scrape(
        at=NOW,
        queue_time=HistogramTotals(10.0, 10.0),  # counters went back: 10 requests since restart
        time_to_first_token=HistogramTotals(15.0, 10.0),
    )
    decision = run(
        policy_of(prefill=prefill),
        (PodObservation("a", True, after, before), PodObservation("b", True, restarted, before)),
        pods(1, running=32.0),
        (2, 1),
    )
    readings = {r.signal: r for r in decision.roles["prefill"].readings}
    assert readings[Signal.QUEUE_TIME].value == pytest.approx(30.0 / 30.0)
    assert readings[Signal.TIME_TO_FIRST_TOKEN].value == pytest.approx(45.0 / 30.0)
    assert decision.roles["prefill"].desired == 4  # queue time 1 s vs 0.5 s: twice the pods
    assert decision.roles["prefill"].deciding_signal is Signal.QUEUE_TIME


def test_an_idle_role_with_quiet_latency_signals_goes_down_to_its_minimum() -> None:
    """No request finished in the window: latency has no opinion, and that is not missing data."""
    prefill = role_policy({Signal.WAITING_PER_POD: 4.0, Signal.QUEUE_TIME: 0.5}, min_replicas=2)
    quiet = Scrape(at=NOW - 15, waiting=0.0, queue_time=HistogramTotals(100.0, 1000.0))
    same = replace(quiet, at=NOW)
    idle = tuple(PodObservation(f"p{i}", True, same, quiet) for i in range(6))
    decision = run(policy_of(prefill=prefill), idle, pods(1, running=32.0), (6, 1))
    readings = {r.signal: r for r in decision.roles["prefill"].readings}
    assert readings[Signal.QUEUE_TIME].coverage is Coverage.QUIET
    assert decision.roles["prefill"].desired == 2
    assert not decision.roles["prefill"].held_for_missing_data


def test_a_role_without_autoscaling_keeps_its_count() -> None:
    decision = run(policy_of(prefill=None), pods(3), pods(1, running=32.0), (3, 1))
    assert decision.roles["prefill"].desired == 3
    assert decision.roles["prefill"].deciding_signal is None
    assert "not autoscaled" in decision.roles["prefill"].reason


def test_an_external_role_without_a_count_from_its_scale_endpoint_keeps_its_count() -> None:
    external = RoleAutoscaling(source="External", min_replicas=1, max_replicas=8)
    decision = run(policy_of(prefill=external), pods(3, waiting=40.0), pods(1), (3, 1))
    assert decision.roles["prefill"].desired == 3
    assert "no signal configured" in decision.roles["prefill"].reason
    asked = evaluate(
        policy_of(prefill=external), both((), ()), both(3, 1), EMPTY, NOW, both(9, None)
    )
    assert asked.roles["prefill"].desired == 8
    assert "set to 9 through its scale endpoint; maxReplicas 8" in asked.roles["prefill"].reason


# ---------------------------------------------------------------------------------------------
# Stabilisation and step limits

BEHAVED = role_policy(
    {Signal.WAITING_PER_POD: 4.0},
    up=ScalingRules(stabilization_window_seconds=30, period_seconds=60, max_pods=2, max_percent=50),
    down=ScalingRules(stabilization_window_seconds=300, period_seconds=60, max_pods=1),
)


@dataclass
class Loop:
    """A closed loop: a total load spread over the prefill's Ready pods, evaluated every `tick`."""

    policy: AutoscalingSpec
    replicas: int
    tick: float = 15.0
    now: float = NOW
    history: Mapping[EngineRole, RoleHistory] = field(default_factory=lambda: EMPTY)
    decisions: list[tuple[float, int, int]] = field(default_factory=list)

    def step(self, total_waiting: float, noise: Callable[[], float] = lambda: 1.0) -> int:
        prefill = tuple(
            PodObservation(
                f"p{i}", True, Scrape(at=self.now, waiting=total_waiting / self.replicas * noise())
            )
            for i in range(self.replicas)
        )
        decision = evaluate(
            self.policy,
            both(prefill, pods(1, at=self.now, running=32.0)),
            both(self.replicas, 1),
            self.history,
            self.now,
        )
        result = decision.roles["prefill"]
        if result.changed:
            self.decisions.append((self.now, result.current, result.desired))
        self.replicas = result.desired
        self.history = decision.history
        self.now += self.tick
        return self.replicas


def test_a_dip_shorter_than_the_scale_down_window_does_not_scale_down() -> None:
    loop = Loop(policy_of(prefill=BEHAVED), replicas=4)
    for _ in range(30):
        loop.step(16.0)  # at target
    for _ in range(19):  # 285 s of almost nothing, less than the 300 s window
        assert loop.step(0.5) == 4
    for _ in range(40):
        assert loop.step(16.0) == 4
    assert loop.decisions == []


def test_a_lasting_dip_scales_down_one_pod_a_period_after_the_window() -> None:
    loop = Loop(policy_of(prefill=BEHAVED), replicas=8)
    for _ in range(30):
        loop.step(32.0)
    start = loop.now
    for _ in range(80):
        loop.step(4.0)  # one pod's worth
    downs = [(at - start, before, after) for at, before, after in loop.decisions]
    # Not before every recommendation of a whole 300 s window is low.
    assert downs[0][0] == 300
    assert all(before - after == 1 for _, before, after in downs)
    assert all(b[0] - a[0] >= 60 for a, b in itertools.pairwise(downs))  # one a period
    assert loop.replicas == 1


def test_a_role_without_targets_or_behavior_scales_on_the_table_of_defaults() -> None:
    bare = RoleAutoscaling(min_replicas=1, max_replicas=8)
    policy = AutoscalingSpec(prefill=bare, decode=bare, ratio=RatioBand(min=0.25, max=1.0))
    assert bare.signal_targets("prefill") == {t.signal: t.value for t in PREFILL_TARGETS.value}
    assert set(bare.signal_targets("decode")) == {
        Signal.KV_CACHE_USAGE,
        Signal.RUNNING_PER_POD,
        Signal.INTER_TOKEN_LATENCY,
    }
    assert bare.signal_targets("decode") == {t.signal: t.value for t in DECODE_TARGETS.value}
    assert (bare.scale_up_rules(), bare.scale_down_rules()) == (SCALE_UP.value, SCALE_DOWN.value)
    assert bare.effective_tolerance() == TOLERANCE.value
    decision = run(policy, pods(2, waiting=12.0), pods(4, running=64.0, kv_cache_usage=0.5), (2, 4))
    assert decision.roles["prefill"].deciding_signal is Signal.WAITING_PER_POD
    assert decision.roles["decode"].deciding_signal is Signal.RUNNING_PER_POD
    # Prefill wants 6, +2 or doubling allows 4; decode wants 8, doubling allows it.
    assert (decision.roles["prefill"].desired, decision.roles["decode"].desired) == (4, 8)


def test_a_spike_scales_up_after_the_up_window_within_the_step_limit() -> None:
    loop = Loop(policy_of(prefill=BEHAVED), replicas=4)
    for _ in range(30):
        loop.step(16.0)
    assert loop.step(40.0) == 4  # first sample of the spike: the 30 s window has older, lower ones
    assert loop.step(40.0) == 4
    assert loop.step(40.0) == 6  # 30 s of spike: up, +2 (the larger of 2 pods and 50% of 4)
    assert loop.step(40.0) == 6  # this period's step is spent
    for _ in range(3):
        loop.step(40.0)
    assert loop.replicas == 9  # next period: +50% of 6 beats +2
    for _ in range(10):
        loop.step(40.0)
    assert loop.replicas == 10
    assert [after - before for _, before, after in loop.decisions] == [2, 3, 1]


def test_a_spike_shorter_than_the_up_window_buys_nothing() -> None:
    loop = Loop(policy_of(prefill=BEHAVED), replicas=4)
    for _ in range(10):
        loop.step(16.0)
    loop.step(100.0)
    loop.step(100.0)
    for _ in range(30):
        loop.step(16.0)
    assert loop.decisions == []


def test_history_keeps_only_what_the_windows_and_periods_need() -> None:
    loop = Loop(policy_of(prefill=BEHAVED), replicas=4)
    for _ in range(100):
        loop.step(40.0)
    history = loop.history["prefill"]
    assert all(r.at > loop.now - loop.tick - 300 for r in history.recommendations)
    assert len(history.recommendations) == 20  # 300 s of 15 s ticks
    assert all(e.at > loop.now - loop.tick - 60 for e in history.scale_events)


def test_a_period_spent_by_earlier_events_holds_even_when_a_bigger_step_is_wanted() -> None:
    history = RoleHistory(
        recommendations=(), scale_events=(ScaleEvent(NOW - 30, 4, 6), ScaleEvent(NOW - 10, 6, 8))
    )
    decision = run(
        policy_of(prefill=BEHAVED),
        pods(8, waiting=16.0),
        pods(1, running=32.0),
        (8, 1),
        history=both(history, RoleHistory()),
    )
    # The period started at 4; +2 or +50% allows 6, which is below 8 already: hold, never down.
    assert decision.roles["prefill"].desired == 8
    assert "step limit allows 8" in decision.roles["prefill"].reason


def test_a_percent_scale_down_limit_still_removes_a_pod_from_a_small_role() -> None:
    prefill = role_policy(
        {Signal.WAITING_PER_POD: 4.0},
        down=ScalingRules(stabilization_window_seconds=0, period_seconds=60, max_percent=10),
    )
    decision = run(policy_of(prefill=prefill), pods(3, waiting=0.0), pods(1, running=32.0), (3, 1))
    assert decision.roles["prefill"].desired == 2


# ---------------------------------------------------------------------------------------------
# min/max and the ratio band


def test_min_and_max_clamp_the_recommendation() -> None:
    prefill = role_policy({Signal.WAITING_PER_POD: 4.0}, min_replicas=2, max_replicas=6)
    flooded = run(policy_of(prefill=prefill), pods(4, waiting=40.0), pods(1, running=32.0), (4, 1))
    assert flooded.roles["prefill"].recommendation == 40
    assert flooded.roles["prefill"].desired == 6
    assert "maxReplicas 6" in flooded.roles["prefill"].reason
    idle = run(policy_of(prefill=prefill), pods(4, waiting=0.0), pods(1, running=32.0), (4, 1))
    assert idle.roles["prefill"].desired == 2
    assert "minReplicas 2" in idle.roles["prefill"].reason
    below = run(policy_of(prefill=prefill), (), pods(1, running=32.0), (0, 1))
    assert below.roles["prefill"].desired == 2  # no data, but below its minimum: raised


def test_the_ratio_band_raises_the_lagging_role_rather_than_cut_the_other() -> None:
    band = RatioBand(min=0.5, max=1.0)
    decision = run(
        policy_of(ratio=band), pods(2, waiting=4.0), pods(4, running=64.0), (2, 4)
    )  # decode wants 8, prefill is content with 2: prefill rises to 4
    assert (decision.roles["prefill"].desired, decision.roles["decode"].desired) == (4, 8)
    assert "prefill:decode band [0.5, 1]: 2 -> 4" in decision.roles["prefill"].reason
    assert decision.ratio_note is not None
    decision = run(policy_of(ratio=band), pods(4, waiting=8.0), pods(2, running=32.0), (4, 2))
    assert (decision.roles["prefill"].desired, decision.roles["decode"].desired) == (8, 8)


def test_the_ratio_band_cuts_a_role_when_the_other_is_at_its_maximum() -> None:
    prefill = role_policy({Signal.WAITING_PER_POD: 4.0}, max_replicas=3)
    decision = run(
        policy_of(prefill=prefill, ratio=RatioBand(min=0.5, max=1.0)),
        pods(3, waiting=4.0),
        pods(4, running=64.0),  # decode wants 8, but 8 decode needs 4 prefill and max is 3
        (3, 4),
    )
    assert (decision.roles["prefill"].desired, decision.roles["decode"].desired) == (3, 6)
    assert "prefill:decode band" in decision.roles["decode"].reason


def test_when_min_max_and_the_ratio_band_conflict_min_max_win() -> None:
    prefill = role_policy({Signal.WAITING_PER_POD: 4.0}, min_replicas=5, max_replicas=6)
    decode = role_policy({Signal.RUNNING_PER_POD: 32.0}, min_replicas=1, max_replicas=2)
    decision = run(
        policy_of(prefill=prefill, decode=decode, ratio=RatioBand(min=0.5, max=1.0)),
        pods(5, waiting=4.0),
        pods(2, running=32.0),
        (5, 2),
    )  # 5..6 prefill for 1..2 decode is never within 0.5..1
    assert (decision.roles["prefill"].desired, decision.roles["decode"].desired) == (5, 2)
    assert decision.ratio_note is not None and "min/max win" in decision.ratio_note
    assert "min/max win" in decision.roles["prefill"].reason


def test_the_ratio_band_uses_the_decimals_written_not_their_floats() -> None:
    """0.3 * 10 is 3.0000000000000004 in floats: 3 prefill for 10 decode is inside [0.3, 0.3]."""
    decision = run(
        policy_of(ratio=RatioBand(min=0.3, max=0.3)),
        pods(3, waiting=4.0),
        pods(10, running=32.0),
        (3, 10),
    )
    assert (decision.roles["prefill"].desired, decision.roles["decode"].desired) == (3, 10)
    assert decision.ratio_note is None


# ---------------------------------------------------------------------------------------------
# Missing, stale and not-Ready


def test_a_stale_scrape_holds_the_role_instead_of_scaling_it_down() -> None:
    fresh = pods(3, waiting=0.0)
    stale = pods(1, at=NOW - 61, waiting=0.0)
    decision = run(policy_of(), fresh + stale, pods(1, running=32.0), (4, 1))
    prefill = decision.roles["prefill"]
    assert prefill.desired == 4
    assert prefill.held_for_missing_data
    assert prefill.readings[0].coverage is Coverage.PARTIAL
    assert "no scale-down on missing or stale metrics" in prefill.reason
    assert "waitingRequestsPerPod (3/4 Ready pods)" in prefill.reason
    # The same pods, all fresh: down it goes.
    assert run(policy_of(), pods(4, waiting=0.0), pods(1), (4, 1)).roles["prefill"].desired == 1


def test_missing_metrics_may_still_scale_up_on_what_is_present() -> None:
    decision = run(
        policy_of(), pods(2, waiting=12.0) + pods(2, at=NOW - 600), pods(1, running=32.0), (4, 1)
    )
    # 24 waiting on the two pods heard from, the silent two counted as idle: 6 pods' worth.
    assert decision.roles["prefill"].desired == 6
    assert decision.roles["prefill"].readings[0].coverage is Coverage.PARTIAL


def test_no_metrics_at_all_holds() -> None:
    decision = run(policy_of(), pods(3), pods(2), (3, 2))
    for result in (decision.roles["prefill"], decision.roles["decode"]):
        assert result.desired == result.current
        assert result.readings[0].coverage is Coverage.MISSING
        assert "no signal voted" in result.reason


def test_a_pod_that_is_not_ready_counts_neither_as_capacity_nor_as_a_source() -> None:
    ready = pods(2, waiting=12.0)  # 3x the target on the two pods that serve
    starting = pods(2, ready=False, waiting=0.0)  # would halve the mean if it counted
    decision = run(policy_of(), ready + starting, pods(1, running=32.0), (4, 1))
    reading = decision.roles["prefill"].readings[0]
    assert (reading.ready_pods, reading.reporting_pods, reading.value) == (2, 2, 12.0)
    assert decision.roles["prefill"].desired == 6  # ceil(2 Ready * 3), not ceil(4 * 1.5)
    # Starting pods do not make the idle Ready ones look busy either, nor block the scale-down.
    idle = run(policy_of(), pods(2, waiting=0.0) + pods(2, ready=False), pods(1), (4, 1))
    assert idle.roles["prefill"].desired == 1


def test_a_role_with_no_ready_pod_holds() -> None:
    decision = run(policy_of(), pods(3, ready=False, waiting=0.0), pods(1, running=32.0), (3, 1))
    assert decision.roles["prefill"].desired == 3
    assert decision.roles["prefill"].readings[0].coverage is Coverage.MISSING


# ---------------------------------------------------------------------------------------------
# MTP-aware decode sizing

MTP_DECODE = role_policy(
    {Signal.RUNNING_PER_POD: 32.0, Signal.DECODE_TOKENS_PER_POD: 1000.0},
    expected_acceptance_length=2.0,
)


def decode_serving(
    count: int, tokens_per_second: float, accepted_per_draft: float, running: float = 32.0
) -> tuple[PodObservation, ...]:
    """Decode pods emitting `tokens_per_second` each; each draft (a request's step) yields
    1 + accepted_per_draft of them."""
    drafts = tokens_per_second * 15 / (1 + accepted_per_draft)
    previous = Scrape(at=NOW - 15, running=running, accepted_tokens=50_000.0, drafts=20_000.0)
    latest = Scrape(
        at=NOW,
        running=running,
        accepted_tokens=50_000.0 + drafts * accepted_per_draft,
        drafts=20_000.0 + drafts,
    )
    return tuple(PodObservation(f"d{i}", True, latest, previous) for i in range(count))


def test_an_acceptance_drop_at_the_same_load_scales_decode_up() -> None:
    policy = policy_of(decode=MTP_DECODE)
    as_expected = run(policy, pods(1, waiting=4.0), decode_serving(4, 1000.0, 2.0), (1, 4))
    assert as_expected.roles["decode"].desired == 4
    acceptance = as_expected.roles["decode"].acceptance
    assert acceptance is not None and acceptance.observed == pytest.approx(2.0)
    # The same 1000 tokens/s per pod (same request rate, same running requests), acceptance down
    # from 2 to 0.5 tokens per draft: each step yields 1.5 tokens instead of 3, so a pod's token
    # capacity halves and decode doubles.
    dropped = run(policy, pods(1, waiting=4.0), decode_serving(4, 1000.0, 0.5), (1, 4))
    result = dropped.roles["decode"]
    assert result.desired == 8
    assert result.deciding_signal is Signal.DECODE_TOKENS_PER_POD
    by_signal = {reading.signal: reading for reading in result.readings}
    assert by_signal[Signal.DECODE_TOKENS_PER_POD].value == pytest.approx(1000.0)
    assert by_signal[Signal.DECODE_TOKENS_PER_POD].target == pytest.approx(500.0)
    assert by_signal[Signal.RUNNING_PER_POD].target == 32.0  # not adjusted: no double count
    assert "MTP acceptance 0.50 vs expected 2.00" in result.reason
    # Better acceptance than expected gives capacity back.
    better = run(policy, pods(1, waiting=4.0), decode_serving(4, 1000.0, 3.5, running=16.0), (1, 4))
    assert better.roles["decode"].desired == 3


def test_an_idle_decode_has_no_token_opinion_and_no_acceptance() -> None:
    decision = run(
        policy_of(decode=MTP_DECODE), pods(1, waiting=4.0), decode_serving(4, 0, 2.0), (1, 4)
    )
    result = decision.roles["decode"]
    acceptance = result.acceptance
    assert acceptance is not None
    assert (acceptance.observed, acceptance.capacity_factor) == (None, 1.0)
    tokens = {r.signal: r for r in result.readings}[Signal.DECODE_TOKENS_PER_POD]
    assert tokens.coverage is Coverage.QUIET
    assert result.desired == 4  # 32 running per pod: at target


def test_the_token_signal_needs_an_expected_acceptance() -> None:
    with pytest.raises(ValidationError, match="set expectedAcceptanceLength"):
        role_policy({Signal.DECODE_TOKENS_PER_POD: 1000.0})
    with_mtp = RoleAutoscaling(min_replicas=1, max_replicas=8, expected_acceptance_length=1.5)
    tokens = MTP_DECODE_TARGETS.value[0]
    assert with_mtp.signal_targets("decode")[tokens.signal] == tokens.value
    without = RoleAutoscaling(min_replicas=1, max_replicas=8)
    assert Signal.DECODE_TOKENS_PER_POD not in without.signal_targets("decode")


def test_an_acceptance_drop_in_a_closed_loop_scales_decode_up_once_and_settles() -> None:
    """A constant request rate (tokens demanded per second) spread over the decode pods, which
    keep up. Acceptance falls from 2 to 0.8 after 10 minutes: 4 pods' worth of tokens now takes
    the steps of 4 * 3 / 1.8 = 6.7 pods, so decode goes to 7 (within the step limits) and stays.
    The running requests, unadjusted, stay at their target by construction: they do not vote."""
    decode = MTP_DECODE.model_copy(update={"behavior": BEHAVED.behavior})
    replicas, now = 4, NOW
    history: Mapping[EngineRole, RoleHistory] = EMPTY
    demand = 4 * 1000.0
    seen = []
    for tick in range(120):
        acceptance = 2.0 if tick < 40 else 0.8
        current = tuple(
            replace(
                pod,
                latest=replace(pod.latest, at=now) if pod.latest else None,
                previous=replace(pod.previous, at=now - 15) if pod.previous else None,
            )
            for pod in decode_serving(replicas, demand / replicas, acceptance)
        )
        decision = evaluate(
            policy_of(decode=decode),
            both(pods(1, at=now, waiting=4.0), current),
            both(1, replicas),
            history,
            now,
        )
        replicas, history = decision.roles["decode"].desired, decision.history
        seen.append(replicas)
        now += 15
    assert set(seen[:40]) == {4}
    assert seen[-1] == 7
    assert sorted(set(seen)) == [4, 6, 7]  # +2 (step limit), then +1 a period later
    assert seen[-60:] == [7] * 60  # settled, no flapping


@given(
    tokens=st.floats(min_value=1, max_value=5000),
    high=st.floats(min_value=0, max_value=4),
    drop=st.floats(min_value=0, max_value=1),
    ready=st.integers(min_value=1, max_value=12),
)
def test_lower_acceptance_never_lowers_the_decode_recommendation(
    tokens: float, high: float, drop: float, ready: int
) -> None:
    policy = policy_of(decode=MTP_DECODE)

    def recommendation(accepted_per_draft: float) -> int:
        decode = decode_serving(ready, tokens, accepted_per_draft)
        return run(policy, pods(1, waiting=4.0), decode, (1, ready)).roles["decode"].recommendation

    assert recommendation(high * (1 - drop)) >= recommendation(high)


# ---------------------------------------------------------------------------------------------
# Properties over arbitrary inputs

metric = st.one_of(st.none(), st.floats(min_value=0, max_value=500))
usage = st.one_of(st.none(), st.floats(min_value=0, max_value=1))


@st.composite
def pod_observations(draw: st.DrawFn, role: str) -> PodObservation:
    ready = draw(st.booleans())
    if draw(st.integers(0, 9)) == 0:
        return PodObservation(role, ready)
    age = draw(st.sampled_from([0.0, 5.0, 30.0, 59.0, 61.0, 600.0]))
    latest = Scrape(
        at=NOW - age,
        waiting=draw(metric),
        running=draw(metric),
        kv_cache_usage=draw(usage),
        accepted_tokens=draw(st.floats(0, 4000)),
        drafts=2000.0,
    )
    previous = Scrape(at=NOW - age - 15, accepted_tokens=0.0, drafts=1000.0)
    return PodObservation(role, ready, latest, previous)


@st.composite
def role_policies(draw: st.DrawFn, role: EngineRole) -> RoleAutoscaling:
    low = draw(st.integers(1, 6))
    high = draw(st.integers(low, 12))
    targets = {
        Signal.WAITING_PER_POD: draw(st.floats(0.5, 50)),
        Signal.RUNNING_PER_POD: draw(st.floats(1, 100)),
        Signal.KV_CACHE_USAGE: draw(st.floats(0.1, 1)),
    }
    # The API refuses the spec-decode signal and its acceptance on a prefill (it drafts nothing).
    expected = None if role == "prefill" else draw(st.one_of(st.none(), st.floats(0, 3)))
    if expected is not None:
        targets[Signal.DECODE_TOKENS_PER_POD] = draw(st.floats(10, 5000))
    chosen = draw(st.lists(st.sampled_from(sorted(targets)), unique=True, max_size=4))
    up = ScalingRules(
        stabilization_window_seconds=draw(st.sampled_from([0, 30, 120])),
        period_seconds=60,
        max_pods=draw(st.one_of(st.none(), st.integers(1, 4))),
        max_percent=draw(st.one_of(st.none(), st.sampled_from([10, 50, 100]))),
    )
    down = ScalingRules(
        stabilization_window_seconds=draw(st.sampled_from([0, 60, 300])),
        period_seconds=60,
        max_pods=draw(st.one_of(st.none(), st.integers(1, 3))),
        max_percent=draw(st.one_of(st.none(), st.sampled_from([10, 50]))),
    )
    return RoleAutoscaling(
        min_replicas=low,
        max_replicas=high,
        # None chosen: the role's defaults.
        targets=[SignalTarget(signal=s, value=targets[s]) for s in chosen] or None,
        behavior=Behavior(scale_up=up, scale_down=down),
        tolerance=draw(st.sampled_from([0.0, 0.1, 0.3])),
        expected_acceptance_length=expected,
    )


ratio_bands = st.one_of(
    st.none(),
    st.tuples(st.sampled_from([0.2, 0.25, 0.3, 0.5, 1.0]), st.sampled_from([1.0, 1.5, 2.0])).map(
        lambda pair: RatioBand(min=min(pair), max=max(pair))
    ),
)


@st.composite
def histories(draw: st.DrawFn) -> RoleHistory:
    recommendations = draw(
        st.lists(
            st.builds(Recommendation, st.floats(NOW - 400, NOW - 1), st.integers(0, 15)),
            max_size=6,
        )
    )
    events = draw(
        st.lists(
            st.builds(
                ScaleEvent, st.floats(NOW - 100, NOW - 1), st.integers(1, 12), st.integers(1, 12)
            ),
            max_size=3,
        )
    )
    return RoleHistory(tuple(recommendations), tuple(events))


@dataclass(frozen=True)
class Case:
    policy: AutoscalingSpec
    prefill: tuple[PodObservation, ...]
    decode: tuple[PodObservation, ...]
    current: tuple[int, int]
    history: Mapping[EngineRole, RoleHistory]

    def evaluate(self) -> Evaluation:
        return run(self.policy, self.prefill, self.decode, self.current, self.history)


@st.composite
def cases(draw: st.DrawFn, ratio: bool = True) -> Case:
    policy = AutoscalingSpec(
        prefill=draw(role_policies("prefill")),
        decode=draw(role_policies("decode")),
        ratio=draw(ratio_bands) if ratio else None,
    )
    current = (draw(st.integers(0, 15)), draw(st.integers(0, 15)))
    return Case(
        policy,
        tuple(draw(st.lists(pod_observations("prefill"), max_size=8))),
        tuple(draw(st.lists(pod_observations("decode"), max_size=8))),
        current,
        both(draw(histories()), draw(histories())),
    )


def band_is_reachable(policy: AutoscalingSpec) -> bool:
    assert policy.ratio is not None
    low, high = Fraction(repr(policy.ratio.min)), Fraction(repr(policy.ratio.max))
    prefill, decode = scaling(policy, "prefill"), scaling(policy, "decode")
    return any(
        low <= Fraction(p, d) <= high
        for p in range(prefill.min_replicas, prefill.max_replicas + 1)
        for d in range(decode.min_replicas, decode.max_replicas + 1)
    )


PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(cases())
def test_every_decision_stays_within_min_max_and_the_reachable_ratio_band(case: Case) -> None:
    decision = case.evaluate()
    prefill, decode = decision.roles["prefill"].desired, decision.roles["decode"].desired
    for role, count in both(prefill, decode).items():
        bounds = scaling(case.policy, role)
        assert bounds.min_replicas <= count <= bounds.max_replicas
    band = case.policy.ratio
    if band is not None:
        inside = Fraction(repr(band.min)) <= Fraction(prefill, decode) <= Fraction(repr(band.max))
        assert inside == band_is_reachable(case.policy)
        assert (decision.ratio_note is not None and "min/max win" in decision.ratio_note) == (
            not inside
        )
    for result in (decision.roles["prefill"], decision.roles["decode"]):
        assert result.reason.startswith(f"{result.role} ")
        assert result.changed == (result.desired != result.current)


@PROPERTY
@given(cases(ratio=False))
def test_missing_or_stale_data_never_scales_a_role_down(case: Case) -> None:
    decision = case.evaluate()
    for role in ENGINE_ROLES:
        result = decision.roles[role]
        rules = scaling(case.policy, role)
        incomplete = any(
            r.coverage in (Coverage.PARTIAL, Coverage.MISSING) for r in result.readings
        )
        if incomplete and result.current <= rules.max_replicas:
            assert result.desired >= result.current
        # Decided only from fresh Ready pods: stale data carries no vote of its own.
        assert all(r.reporting_pods <= r.ready_pods for r in result.readings)


@PROPERTY
@given(cases(), st.lists(pod_observations("late"), min_size=1, max_size=4), st.booleans())
def test_pods_that_are_not_ready_change_nothing(
    case: Case, extra: list[PodObservation], to_decode: bool
) -> None:
    not_ready = tuple(replace(pod, ready=False) for pod in extra)
    with_extra = (
        replace(case, decode=case.decode + not_ready)
        if to_decode
        else replace(case, prefill=not_ready + case.prefill)
    )
    assert with_extra.evaluate() == case.evaluate()


@PROPERTY
@given(cases(ratio=False), st.floats(min_value=1.0, max_value=10.0))
def test_more_load_never_lowers_a_recommendation(case: Case, factor: float) -> None:
    def heavier(pod: PodObservation) -> PodObservation:
        latest = pod.latest
        if latest is None:
            return pod
        return replace(
            pod,
            latest=replace(
                latest,
                waiting=None if latest.waiting is None else latest.waiting * factor,
                running=None if latest.running is None else latest.running * factor,
                kv_cache_usage=(
                    None if latest.kv_cache_usage is None else latest.kv_cache_usage * factor
                ),
            ),
        )

    loaded = replace(
        case,
        prefill=tuple(map(heavier, case.prefill)),
        decode=tuple(map(heavier, case.decode)),
    )
    before, after = case.evaluate(), loaded.evaluate()
    for role in ENGINE_ROLES:
        assert after.roles[role].recommendation >= before.roles[role].recommendation
        assert after.roles[role].desired >= before.roles[role].desired


@PROPERTY
@given(cases(ratio=False))
def test_a_scale_up_stays_within_its_step_limit(case: Case) -> None:
    decision = case.evaluate()
    for role in ENGINE_ROLES:
        result, rules = decision.roles[role], scaling(case.policy, role).scale_up_rules()
        if result.current < scaling(case.policy, role).min_replicas:
            continue  # raised to the minimum, whatever the step
        start = result.current - sum(
            e.after - e.before
            for e in case.history[role].scale_events
            if e.at > NOW - rules.period_seconds
        )
        allowed = [
            *([start + rules.max_pods] if rules.max_pods is not None else []),
            *(
                [math.ceil(start * (1 + rules.max_percent / 100) - 1e-9)]
                if rules.max_percent is not None
                else []
            ),
        ]
        if allowed:
            assert result.desired <= max(max(allowed), result.current)


# ---------------------------------------------------------------------------------------------
# Long simulated runs: no flapping


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    replicas=st.integers(1, 10),
    tolerance=st.sampled_from([0.05, 0.1, 0.2]),
)
def test_noise_inside_the_tolerance_band_never_moves_the_count(
    seed: int, replicas: int, tolerance: float
) -> None:
    prefill = BEHAVED.model_copy(update={"tolerance": tolerance})
    loop = Loop(policy_of(prefill=prefill), replicas=replicas)
    rng = random.Random(seed)
    for _ in range(480):  # two hours of 15 s evaluations
        loop.step(4.0 * replicas, noise=lambda: 1 + rng.uniform(-tolerance, tolerance) * 0.99)
    assert loop.decisions == []


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), amplitude=st.sampled_from([0.3, 0.5, 0.8]))
def test_noise_beyond_the_band_does_not_flap(seed: int, amplitude: float) -> None:
    """Per-pod noise well beyond the 10% band around a load worth 6 pods, for two hours: the
    count may move, but a scale-down never follows a scale-up within the 300 s window, and there
    are only a handful of decisions."""
    loop = Loop(policy_of(prefill=BEHAVED), replicas=6)
    rng = random.Random(seed)
    for _ in range(480):
        loop.step(24.0, noise=lambda: max(0.0, 1 + rng.uniform(-amplitude, amplitude)))
    for (at, before, after), (next_at, next_before, next_after) in itertools.pairwise(
        loop.decisions
    ):
        if after > before and next_after < next_before:
            assert next_at - at >= 300
    assert len(loop.decisions) <= 6  # in 480 evaluations (seen: 0 to 2)
