"""A decode replica that spans two "nodes": two vLLM data-parallel ranks as `pdmtp render` gives
the pods of a multi-node group (spec.decode.multiNode: 2 nodes, DataParallel, 2 ranks), behind
the real router that lists only the group's leader, with KV from the single-node prefill over
Mooncake TCP and MTP (k=3) on every engine.

The group runs as two processes on loopback, each started by the engine image's launcher with
its pod's rendered args and env (wiring.group_on_one_host lists what changes for one host: the
leader's DNS name becomes 127.0.0.1 and the rendezvous port a free one). The prefill is the
1P+1D tier's k=3 prefill: the same PDDeployment renders it identically whatever the decode's
shape, which the test checks before reusing it, and the reference outputs are the tier's.

Both ranks start together (each vLLM start is a chain of single-threaded imports, which overlap).
The worker is held (SIGSTOP of its process tree, as a slow node would be) from the moment it
starts loading its model until the leader's own rank is up; the leader's /health is probed then,
and the worker let go.

Asserted: the leader is not healthy while only its own rank is up; the worker joins and the
leader becomes healthy; every answer equals one engine's, token for token; both ranks served
requests, pulled KV with the backoff and ran MTP drafts (the leader's per-rank metrics, labelled
`engine="<rank>"`); the prefill pushed KV once per request. Recorded, not asserted (vLLM's
behaviour, not the product's): what the leader's /health says after the worker is killed.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fleet import (
    Completion,
    Figures,
    Fleet,
    Prompt,
    complete,
    completion_body,
    start_router,
    transfer_durations_ms,
)
from loopback import LOOPBACK
from processes import Engine, ManagedProcess, http, launcher_command, metric_by, start_engine
from tier import (
    CORE_OF_DECODE_RANK,
    DECODE_GROUP_RANKS,
    MAX_TOKENS,
    fixed_launches,
    pinned,
    render_decode_group,
)
from wiring import EngineWiring

K = 3
BACKOFF = K - 1
RECOMPUTED = BACKOFF + K
"""The backoff and the drafter refresh (connector.drafter_refresh: the lookahead, k)."""
RANKS = DECODE_GROUP_RANKS
RANK_UP = "Waiting for READY message from DP Coordinator"
"""vLLM's engine core logs it (INFO, every 10 s) once its model and KV cache are up, while the
DP coordinator waits for every rank of the group to subscribe."""
RANK_LOADING = "Starting to load model"
"""A rank's model runner begins loading: the last few seconds before the rank is up."""
JOINED = "All engine subscriptions received by DP coordinator"
START_TIMEOUT = 420.0
REQUEST_TIMEOUT = 120.0
LOSS_WATCH = 15.0
STOP_GRACE = 5.0
"""The group is stopped after its worker was killed: its graceful shutdown is not under test."""


@dataclass(frozen=True)
class RankRequest:
    """One prompt through the router, and what the leader's per-rank counters saw of it."""

    prompt: Prompt
    completion: Completion
    rank: str | None
    """The rank whose `vllm:request_success_total` went up by one (None: not exactly one)."""
    prompt_tokens: dict[str, float]
    """That rank's change in `vllm:prompt_tokens_by_source_total`, by source."""


@dataclass(frozen=True)
class BeforeJoin:
    """The leader with its own rank up and the worker held before its rank is."""

    leader_rank_up: float
    """Seconds from the leader's start to its rank's RANK_UP line."""
    joined: bool
    """Whether the coordinator had every rank by then (it must not: the worker was held)."""
    health: str
    """The leader's /health answer then."""
    held_seconds: float


@dataclass(frozen=True)
class GroupRun:
    wiring: list[EngineWiring]
    prefill_rendered_alike: bool
    before_join: BeforeJoin
    requests: list[RankRequest]
    drafts_by_rank: dict[str, float]
    routed_ranks: list[int]
    router_decodes: list[str]
    launcher_lines: list[list[str]]
    logs: list[str]
    transfers: int


def _health(url: str) -> str:
    """What /health answers, in words (no answer within the probe's time is an answer too)."""
    try:
        status, _ = http("GET", url + "/health", timeout=3)
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    return f"HTTP {status}"


def _per_rank(leader: Engine) -> tuple[dict[tuple[str, ...], float], dict[tuple[str, ...], float]]:
    samples = leader.metrics()
    return (
        metric_by(samples, "vllm:request_success_total", "engine"),
        metric_by(samples, "vllm:prompt_tokens_by_source_total", "engine", "source"),
    )


def _signal_tree(process: ManagedProcess, signum: signal.Signals) -> None:
    """`signum` to the process and everything it started (its own session)."""
    assert process.proc is not None
    os.killpg(process.proc.pid, signum)


def _leader_alone(leader: Engine, worker: Engine) -> BeforeJoin:
    """Hold the worker from RANK_LOADING (or from the leader's rank being up, whichever comes
    first) until the leader's rank is up; probe the leader's /health then; let the worker go."""
    held_at: float | None = None
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while True:
            for process in (leader.process, worker.process):
                code = process.exited()
                if code is not None:
                    raise RuntimeError(f"{process.name} exited {code}:\n{process.log()}")
            leader_up = RANK_UP in leader.process.log(tail=10**8)
            if held_at is None and (leader_up or RANK_LOADING in worker.process.log(tail=10**8)):
                _signal_tree(worker.process, signal.SIGSTOP)
                held_at = time.monotonic()
            if leader_up:
                # The worker is held: nothing can join between this read and the probe.
                joined = JOINED in leader.process.log(tail=10**8)
                return BeforeJoin(
                    leader_rank_up=round(time.monotonic() - leader.process.started_at, 1),
                    joined=joined,
                    health=_health(leader.url),
                    held_seconds=round(time.monotonic() - (held_at or time.monotonic()), 1),
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"the leader's rank not up in {START_TIMEOUT}s")
            time.sleep(0.5)
    finally:
        if held_at is not None:
            _signal_tree(worker.process, signal.SIGCONT)


def _health_after_losing(worker: Engine, leader: Engine) -> list[str]:
    """A lost node, observed and recorded (not asserted: it is vLLM's behaviour, not the
    product's): the worker's whole process tree killed at once, then the leader's /health
    every second for LOSS_WATCH seconds, as "<seconds after the kill>: <answer>" per change."""
    _signal_tree(worker.process, signal.SIGKILL)
    killed = time.monotonic()
    seen: list[str] = []
    last = None
    while time.monotonic() - killed < LOSS_WATCH:
        answer = _health(leader.url)
        if answer != last:
            seen.append(f"{time.monotonic() - killed:.1f}: {answer}")
            last = answer
        time.sleep(1)
    return seen


@pytest.fixture(scope="module")
def group_run(
    fleet: Fleet,
    model: Path,
    prompts: list[Prompt],
    figures: Figures,
    workdir: Path,
    reference: dict[str, Completion],  # the reference runs (and is released) first
    wirings: Callable[[int], dict[str, EngineWiring]],
) -> Iterator[GroupRun]:
    single = wirings(K)
    rendered = render_decode_group(model, K, single["prefill"])
    # The prefill Deployment of this PDDeployment is the 1P+1D one's: reuse that engine.
    prefill_alike = rendered.prefill == single["prefill"]
    prefill_launch = fixed_launches(K, single)[0]
    (prefill,) = fleet.acquire([prefill_launch])
    fleet.make_room(RANKS, keep=[prefill_launch.name])
    if len(rendered.routed) != 1:
        raise AssertionError(f"the operator's router lists ranks {rendered.routed} of the group")
    ranks: list[Engine] = []
    router = None
    try:
        started = time.monotonic()
        for rank, wiring in enumerate(rendered.decode):
            ranks.append(
                start_engine(
                    f"decode-dp{RANKS}-rank{rank}",
                    launcher_command(wiring.args),
                    wiring.env,
                    wiring.url,
                    workdir,
                    host_env=pinned(CORE_OF_DECODE_RANK[rank]),
                )
            )
        leader, worker = ranks
        before_join = _leader_alone(leader, worker)
        leader.wait_ready(START_TIMEOUT, with_ranks=[worker.process])
        figures.engine_ready_seconds[f"decode-dp{RANKS}"] = round(time.monotonic() - started, 1)
        figures.notes["decode_group_start"] = {
            "leader_rank_up_s": before_join.leader_rank_up,
            "worker_held_s": before_join.held_seconds,
        }
        for rank, engine in enumerate(ranks):
            figures.note_rss(f"decode-dp{RANKS}-rank{rank}", engine)

        sent_before = len(transfer_durations_ms(prefill))
        # In front of the rank the operator's router lists (the leader, asserted below).
        routed = rendered.decode[rendered.routed[0]]
        router = start_router(rendered.prefill, routed, workdir, f"router-dp{RANKS}")
        command = list(router.process.command)
        router_decodes = [command[i + 1] for i, a in enumerate(command) if a == "--decode"]
        requests = []
        for prompt in prompts:
            success_before, tokens_before = _per_rank(leader)
            body = completion_body(model, prompt, MAX_TOKENS)
            completion = complete(router.url, body, timeout=REQUEST_TIMEOUT)
            success_after, tokens_after = _per_rank(leader)
            served = [
                engine
                for (engine,), value in success_after.items()
                if value - success_before.get((engine,), 0.0) == 1
            ]
            served_by = served[0] if len(served) == 1 else None
            requests.append(
                RankRequest(
                    prompt=prompt,
                    completion=completion,
                    rank=served_by,
                    prompt_tokens={
                        source: value - tokens_before.get((engine, source), 0.0)
                        for (engine, source), value in tokens_after.items()
                        if engine == served_by
                    },
                )
            )
            if completion.status != 200:
                break  # the test fails on it; the rest would wait as long
        drafts = metric_by(leader.metrics(), "vllm:spec_decode_num_drafts_total", "engine")
        transfers = len(transfer_durations_ms(prefill)) - sent_before
        for rank, engine in enumerate(ranks):
            figures.note_rss(f"decode-dp{RANKS}-rank{rank}", engine)
        health_after_loss = _health_after_losing(worker, leader)
    finally:
        if router is not None:
            router.process.stop()
        for engine in ranks:
            engine.process.stop(grace=STOP_GRACE)
        fleet.release([prefill_launch.name])
    figures.request_seconds[f"pd-decode-dp{RANKS}"] = [
        round(r.completion.seconds, 3) for r in requests
    ]
    figures.notes["decode_group"] = {
        "ranks_args": [list(w.args) for w in rendered.decode],
        "substitutions": [list(w.substituted) for w in rendered.decode],
        "health_before_join": before_join.health,
        "rank_of_request": {r.prompt.name: r.rank for r in requests},
        "drafts_by_rank": {engine: value for (engine,), value in drafts.items()},
        "leader_health_after_the_worker_was_killed": health_after_loss,
    }
    logs = [engine.process.log(tail=10**8) for engine in ranks]
    yield GroupRun(
        wiring=rendered.decode,
        prefill_rendered_alike=prefill_alike,
        before_join=before_join,
        requests=requests,
        drafts_by_rank={engine: value for (engine,), value in drafts.items()},
        routed_ranks=rendered.routed,
        router_decodes=router_decodes,
        launcher_lines=[
            [line for line in log.splitlines() if line.startswith("pdmtp-engine:")] for log in logs
        ],
        logs=logs,
        transfers=transfers,
    )


def test_the_group_is_run_as_rendered(group_run: GroupRun) -> None:
    """The rendered rank flags reach vLLM (only the leader's address and the port changed), the
    prefill is the 1P+1D one, and the launcher verified every rank before starting vLLM."""
    leader, worker = (list(w.args) for w in group_run.wiring)
    tail = ["--data-parallel-size", "2", "--data-parallel-size-local", "1"]
    tail += ["--data-parallel-address", LOOPBACK, "--data-parallel-rpc-port"]
    at = leader.index("--data-parallel-size")
    assert leader[at : at + len(tail)] == tail
    assert worker[at : at + len(tail)] == tail
    port = leader[at + len(tail)]
    assert worker[at + len(tail)] == port
    assert "--headless" not in leader
    assert "--data-parallel-start-rank" not in leader
    assert worker[at + len(tail) + 1 : at + len(tail) + 4] == [
        "--headless",
        "--data-parallel-start-rank",
        "1",
    ]
    for rank, wiring in enumerate(group_run.wiring):
        assert wiring.env["PDMTP_GROUP_RANK"] == str(rank)
        assert wiring.env["PDMTP_GROUP_SIZE"] == "2"
        assert wiring.env["PDMTP_LEADER_ADDRESS"] == LOOPBACK
    assert group_run.prefill_rendered_alike
    for lines in group_run.launcher_lines:
        assert lines == [
            f"pdmtp-engine: method=mtp k={K} mtp_modules=3, lookahead={K}, "
            f"prefill_backoff={BACKOFF}, kv_role=kv_consumer: starting vLLM"
        ]


def test_the_leader_is_not_healthy_until_the_worker_joins(group_run: GroupRun) -> None:
    before = group_run.before_join
    assert not before.joined
    assert not before.health.startswith("HTTP 200"), before.health
    # Then the worker joined, and the leader became healthy (the fixture waited for a 200).
    assert JOINED in group_run.logs[0]
    # The worker ran its rank in headless mode against the leader's rendezvous port.
    port = group_run.wiring[0].flag("--data-parallel-rpc-port")
    assert f"headless mode, with head node address tcp://{LOOPBACK}:{port}" in group_run.logs[1]


def test_the_router_lists_only_the_leader(group_run: GroupRun) -> None:
    """The operator's own membership code lists rank 0 alone, and the router so started sends
    every decode to the leader's API server, whichever rank then runs it."""
    assert group_run.routed_ranks == [0]
    assert group_run.router_decodes == [group_run.wiring[0].url]


def test_greedy_outputs_are_identical_to_one_engine(
    group_run: GroupRun, reference: dict[str, Completion], prompts: list[Prompt]
) -> None:
    differing = {}
    assert [one.prompt for one in group_run.requests] == prompts
    for one in group_run.requests:
        got, want = one.completion, reference[one.prompt.name]
        assert got.status == 200, f"{one.prompt.name}: {got.error}"
        assert got.token_ids is not None
        if got.token_ids != want.token_ids:
            differing[one.prompt.name] = (got.token_ids, want.token_ids)
    assert differing == {}


def test_both_ranks_served_pulled_kv_with_the_backoff_and_drafted(group_run: GroupRun) -> None:
    ranks = [one.rank for one in group_run.requests]
    assert sorted({str(rank) for rank in ranks}) == [str(r) for r in range(RANKS)], ranks
    for one in group_run.requests:
        n = len(one.prompt.token_ids)
        assert one.prompt_tokens == {
            "local_compute": RECOMPUTED,
            "local_cache_hit": 0,
            "external_kv_transfer": n - RECOMPUTED,
        }, (one.prompt.name, one.rank)
    assert sorted(group_run.drafts_by_rank) == [str(r) for r in range(RANKS)]
    assert all(drafts > 0 for drafts in group_run.drafts_by_rank.values()), group_run.drafts_by_rank


def test_the_prefill_pushed_kv_once_per_request(group_run: GroupRun) -> None:
    assert group_run.transfers == len(group_run.requests)
