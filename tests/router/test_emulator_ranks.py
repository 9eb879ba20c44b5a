"""The emulator's multi-node replicas behave as a vLLM engine's ranks do (images/engine-emulator/
pdmtp_emulator/ranks.py): the leader is not Ready and serves nothing until every headless rank
has joined its rendezvous port, a rank that goes away kills the leader's engine for good (and its
process, non-zero), a leader that goes away ends its ranks, a duplicate rank is refused.

Each pod is a real `python -m pdmtp_emulator engine vllm serve ...` process with the args and env
the operator renders for that group pod (pdmtp.cli.render.rendered_children), moved onto
loopback: the listen host, the leader's address and every port are 127.0.0.1 and free ports.
Nothing here binds or dials anything but 127.0.0.1; every wait has a bound.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from builders import pdd
from loopback import LOOPBACK, free_ports
from pdmtp.api import vocabulary as v
from pdmtp.cli.render import rendered_children

# On sys.path through router.emulator, which the tier's conftest imports before any test module.
from pdmtp_emulator import ranks
from pdmtp_emulator.serve import parse_vllm_serve, pod_name, revision_from_pod_name
from router.harness import completion_body, get, post

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "images" / "engine-emulator"
BOUND = 10.0
"""No single wait in this file is longer."""
DEAD_EXIT_SECONDS = 1.0
DP_GROUP = {"nodes": 2, "layout": "DataParallel", "dataParallelSize": 2}
TP_GROUP = {"nodes": 3, "layout": "TensorParallel"}
RENDEZVOUS_FLAGS = {
    "DataParallel": ("--data-parallel-address", "--data-parallel-rpc-port"),
    "TensorParallel": ("--master-addr", "--master-port"),
}


# ---- the operator's group pods ---------------------------------------------------------------


def group_pods(multi_node: dict[str, Any], tp: int = 1) -> list[dict[str, Any]]:
    """The pods of the decode's first group as the operator renders them, in rank order."""
    spec = pdd("wide", "serving").decode(replicas=1, tp=tp, multiNode=multi_node).build()
    pods = [
        c
        for c in rendered_children(spec)
        if c["kind"] == "Pod" and c["metadata"]["labels"].get(v.LABEL_GROUP) == "g0"
    ]
    pods.sort(key=lambda p: int(p["metadata"]["labels"][v.LABEL_GROUP_RANK]))
    assert len(pods) == multi_node["nodes"], [p["metadata"]["name"] for p in pods]
    return pods


def single_node_pod() -> dict[str, Any]:
    """A decode Deployment's pod (one node), named as its ReplicaSet would name it."""
    dep = next(
        c
        for c in rendered_children(pdd("wide", "serving").build())
        if c["kind"] == "Deployment" and c["metadata"]["name"].endswith("-decode")
    )
    template: dict[str, Any] = dep["spec"]["template"]
    name = f"{dep['metadata']['name']}-7d9f8b6c5-x1z2q"
    return {**template, "metadata": {**template["metadata"], "name": name}}


def container(pod: dict[str, Any]) -> dict[str, Any]:
    engine: dict[str, Any] = pod["spec"]["containers"][0]
    return engine


def plain_env(pod: dict[str, Any]) -> dict[str, str]:
    """The container's literal env (VLLM_HOST_IP comes from the downward API: not here)."""
    return {e["name"]: e["value"] for e in container(pod)["env"] if "value" in e}


def with_values(args: list[str], values: dict[str, str]) -> list[str]:
    """`args` with the value after each flag in `values` replaced; every flag must be there."""
    out = list(args)
    for flag, value in values.items():
        out[out.index(flag) + 1] = value
    return out


@dataclass
class Pod:
    """One group pod of a rendered spec, moved onto loopback free ports."""

    rendered: dict[str, Any]
    layout: str
    http_port: int
    rendezvous_port: int

    @property
    def argv(self) -> list[str]:
        address, port = RENDEZVOUS_FLAGS[self.layout]
        return with_values(
            container(self.rendered)["args"],
            {
                "--host": LOOPBACK,
                "--port": str(self.http_port),
                address: LOOPBACK,
                port: str(self.rendezvous_port),
            },
        )

    @property
    def env(self) -> dict[str, str]:
        env = plain_env(self.rendered)
        env.pop("PDMTP_METRICS_PORT")  # a fixed port; not what these tests are about
        return {**env, "HOSTNAME": self.rendered["spec"]["hostname"]}

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}"

    @property
    def revision(self) -> str:
        revision: str = self.rendered["metadata"]["labels"][v.LABEL_REVISION]
        return revision


def local_group(multi_node: dict[str, Any], tp: int = 1) -> list[Pod]:
    pods = group_pods(multi_node, tp)
    ports = free_ports(len(pods) + 1)
    return [Pod(p, multi_node["layout"], ports[i], ports[-1]) for i, p in enumerate(pods)]


# ---- emulator processes ----------------------------------------------------------------------


@dataclass
class Emulator:
    """`python -m pdmtp_emulator engine <argv>` in its own session; its JSON log lines kept."""

    name: str
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def events(self, msg: str) -> list[dict[str, Any]]:
        out = []
        for line in list(self.lines):
            if line.startswith("{"):
                event = json.loads(line)
                if event.get("msg") == msg:
                    out.append(event)
        return out

    def log(self) -> str:
        return "\n".join(self.lines[-50:])

    def wait_event(self, msg: str, timeout: float = BOUND, count: int = 1) -> dict[str, Any]:
        """The last `msg` line once there are at least `count` of them (the leader logs a refusal
        after it has closed the connection, so a client may be answered before the line)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(found := self.events(msg)) >= count:
                return found[-1]
            if self.proc.poll() is not None:
                time.sleep(0.1)  # the reader may still hold its last lines
                if len(found := self.events(msg)) >= count:
                    return found[-1]
                break
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: no {msg!r} (exit {self.proc.poll()}):\n{self.log()}")

    def wait_exit(self, timeout: float = BOUND) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running after {timeout}s:\n{self.log()}"
            ) from None

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def running(self) -> bool:
        return self.proc.poll() is None


Start = Callable[..., Emulator]


@pytest.fixture
def start() -> Iterator[Start]:
    """Start emulator processes; every one still running at the end is killed."""
    started: list[Emulator] = []

    def run(name: str, argv: list[str], env: dict[str, str], **knobs: str) -> Emulator:
        full_env = {
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": str(PACKAGE_ROOT),
            "PYTHONUNBUFFERED": "1",
            ranks.ENV_DEAD_EXIT_SECONDS: str(DEAD_EXIT_SECONDS),
            ranks.ENV_RENDEZVOUS_SECONDS: str(BOUND),
            **env,
            **knobs,
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "pdmtp_emulator", "engine", *argv],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own group: the cleanup ends exactly what was started
        )
        emu = Emulator(name, proc)
        started.append(emu)
        return emu

    yield run
    for emu in started:
        emu.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            emu.proc.wait(timeout=5)


def start_pod(start: Start, pod: Pod, **knobs: str) -> Emulator:
    return start(pod.rendered["spec"]["hostname"], pod.argv, pod.env, **knobs)


def health(url: str) -> tuple[int, str]:
    status, body = get(f"{url}/health", timeout=2)
    return status, body.decode()


def wait_health(url: str, want: Callable[[int, str], bool], what: str) -> tuple[int, str]:
    deadline = time.monotonic() + BOUND
    last: tuple[int, str] | str = "no answer"
    while time.monotonic() < deadline:
        try:
            last = health(url)
        except OSError as exc:
            last = repr(exc)
        else:
            if want(*last):
                return last
        time.sleep(0.05)
    raise AssertionError(f"{url}/health never {what}: last {last}")


def completion_status(url: str) -> int:
    return post(url, "/v1/completions", completion_body(max_tokens=2), timeout=5).status


def join_group(start: Start, pods: list[Pod], **knobs: str) -> list[Emulator]:
    """The leader, then its ranks; returns them once the leader is Ready."""
    leader = start_pod(start, pods[0], **knobs)
    workers = [start_pod(start, pod, **knobs) for pod in pods[1:]]
    leader.wait_event("group complete")
    wait_health(pods[0].url, lambda s, _: s == 200, "200")
    return [leader, *workers]


# ---- unit: what a group pod reads from its args and env --------------------------------------


@pytest.mark.parametrize(("multi_node", "tp"), [(DP_GROUP, 1), (TP_GROUP, 3)])
def test_a_group_pod_finds_its_name_revision_and_place_in_the_group(
    multi_node: dict[str, Any], tp: int
) -> None:
    for rank, pod in enumerate(group_pods(multi_node, tp)):
        env = plain_env(pod)
        meta = pod["metadata"]
        # $HOSTNAME is the pod's `hostname`, not its name: the name comes back with the subdomain.
        assert pod_name(env, pod["spec"]["hostname"]) == meta["name"]
        assert revision_from_pod_name(meta["name"], "decode") == meta["labels"][v.LABEL_REVISION]
        args = parse_vllm_serve(container(pod)["args"])
        group = ranks.group_from(args, env)
        assert group == ranks.Group(
            layout=multi_node["layout"],
            nodes=multi_node["nodes"],
            node_rank=rank,
            address=env["PDMTP_LEADER_ADDRESS"],
            port=args.data_parallel_rpc_port
            if multi_node["layout"] == "DataParallel"
            else args.master_port,
        )
        assert group.leader is (rank == 0)


def test_a_single_node_pod_is_no_group_and_keeps_its_name() -> None:
    pod = single_node_pod()
    env, name = plain_env(pod), pod["metadata"]["name"]
    assert pod_name(env, name) == name
    assert revision_from_pod_name(name, "decode") == pod["metadata"]["labels"][v.LABEL_REVISION]
    assert ranks.group_from(parse_vllm_serve(container(pod)["args"]), env) is None


def _group_args(*extra: str) -> argparse.Namespace:
    return parse_vllm_serve(["vllm", "serve", "m", *extra])


@pytest.mark.parametrize(
    ("extra", "env", "why"),
    [
        (("--data-parallel-size", "4", "--data-parallel-size-local", "3"), {}, "not whole nodes"),
        (("--nnodes", "2", "--node-rank", "1", "--master-addr", "a"), {}, "headless"),
        (("--nnodes", "2", "--master-addr", "a", "--headless"), {}, "headless"),
        (("--nnodes", "2", "--node-rank", "2", "--master-addr", "a", "--headless"), {}, "not one"),
        (("--nnodes", "2"), {}, "leader's address"),
        (("--nnodes", "2", "--master-addr", "a"), {"PDMTP_GROUP_SIZE": "3"}, "GROUP_SIZE=3"),
        (("--nnodes", "2", "--master-addr", "a"), {"PDMTP_GROUP_RANK": "1"}, "GROUP_RANK=1"),
        ((), {"PDMTP_GROUP_SIZE": "2"}, "GROUP_SIZE=2"),
    ],
)
def test_args_that_contradict_themselves_or_the_env_stop_the_pod(
    extra: tuple[str, ...], env: dict[str, str], why: str
) -> None:
    with pytest.raises(SystemExit, match=why):
        ranks.group_from(_group_args(*extra), env)


# ---- processes -------------------------------------------------------------------------------


def test_a_single_node_pod_serves_at_once_as_before(start: Start) -> None:
    pod = single_node_pod()
    (port,) = free_ports(1)
    argv = with_values(container(pod)["args"], {"--host": LOOPBACK, "--port": str(port)})
    env = {**plain_env(pod), "HOSTNAME": pod["metadata"]["name"]}
    env.pop("PDMTP_METRICS_PORT")
    emu = start("decode", argv, env)
    serving = emu.wait_event("serving")
    assert serving["group"] is None
    assert serving["identity"]["revision"] == pod["metadata"]["labels"][v.LABEL_REVISION]
    url = f"http://{LOOPBACK}:{port}"
    assert health(url)[0] == 200
    assert completion_status(url) == 200
    emu.signal(signal.SIGTERM)
    assert emu.wait_exit() == 0


def test_a_dp_leader_serves_once_its_rank_joins_and_dies_with_it(start: Start) -> None:
    leader_pod, worker_pod = local_group(DP_GROUP)
    leader = start_pod(start, leader_pod)
    leader.wait_event("serving")
    # Up, but not Ready and serving nothing: its rank has not joined.
    assert health(leader_pod.url) == (503, "engine starting")
    assert completion_status(leader_pod.url) == 503

    worker = start_pod(start, worker_pod)
    joined = leader.wait_event("rank joined")
    assert joined["rank"] == 1 and joined["peer"].startswith(f"{LOOPBACK}:"), joined
    assert leader.wait_event("group complete")["ranks"] == {"1": joined["peer"]}
    wait_health(leader_pod.url, lambda s, _: s == 200, "200")
    assert completion_status(leader_pod.url) == 200
    # Its provenance names the pod and revision the operator gave it (the name rebuilt).
    status, body = get(f"{leader_pod.url}/pdmtp/identity")
    assert status == 200
    identity = json.loads(body)
    assert identity["pod"] == leader_pod.rendered["metadata"]["name"]
    assert identity["revision"] == leader_pod.revision
    assert worker.running()
    assert worker.wait_event("joined the leader")["pod"] == worker_pod.rendered["metadata"]["name"]

    # The rank crashes: the engine is dead, at once and for good, and the process exits.
    worker.signal(signal.SIGKILL)
    assert wait_health(leader_pod.url, lambda s, _: s != 200, "fails") == (503, "engine dead")
    assert completion_status(leader_pod.url) == 500
    assert leader.wait_event("rank lost")["rank"] == 1
    assert leader.wait_event("engine dead")
    assert leader.wait_exit() == ranks.EXIT_ENGINE_DEAD


def test_a_rank_started_before_its_leader_waits_and_a_dead_leader_stays_dead(
    start: Start,
) -> None:
    leader_pod, worker_pod = local_group(DP_GROUP)
    worker = start_pod(start, worker_pod)
    waiting = worker.wait_event("waiting for the leader")
    assert "ConnectionRefusedError" in waiting["error"], waiting
    # A hold, not a wait: it must still be waiting after two more refused attempts.
    time.sleep(2 * ranks.RETRY_SECONDS)
    assert worker.running()

    # Time enough to see that a rank coming back does not revive the engine.
    leader = start_pod(start, leader_pod, **{ranks.ENV_DEAD_EXIT_SECONDS: "3"})
    leader.wait_event("group complete")
    wait_health(leader_pod.url, lambda s, _: s == 200, "200")

    # A rank stopped gracefully (SIGTERM after the preStop) exits 0; the engine still dies.
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit() == 0
    leader.wait_event("engine dead")
    again = start_pod(start, worker_pod)
    assert again.wait_exit() == ranks.EXIT_REFUSED
    assert leader.wait_event("rank refused")["reason"] == "engine dead"
    assert health(leader_pod.url) == (503, "engine dead")
    assert completion_status(leader_pod.url) == 500
    assert leader.wait_exit() == ranks.EXIT_ENGINE_DEAD


def _hello(port: int, hello: bytes) -> bytes:
    """Send one hello to the rendezvous port; what the leader answers before it closes."""
    with socket.create_connection((LOOPBACK, port), timeout=BOUND) as sock:
        sock.sendall(hello)
        return sock.makefile("rb").read()


def test_a_duplicate_or_foreign_rank_is_refused_and_the_engine_serves_on(start: Start) -> None:
    pods = local_group(DP_GROUP)
    leader, _worker = join_group(start, pods)

    duplicate = start_pod(start, pods[1])
    assert duplicate.wait_exit() == ranks.EXIT_REFUSED
    assert duplicate.wait_event("refused by the leader")["rank"] == 1
    port = pods[0].rendezvous_port
    # Closed without an answer: out of range, another group size, not a hello at all.
    assert _hello(port, b'{"rank": 2, "nodes": 2}\n') == b""
    assert _hello(port, b'{"rank": 0, "nodes": 2}\n') == b""
    assert _hello(port, b'{"rank": 1, "nodes": 3}\n') == b""
    assert _hello(port, b"hello\n") == b""
    leader.wait_event("rank refused", count=5)
    reasons = [e["reason"] for e in leader.events("rank refused")]
    assert len(reasons) == 5, reasons
    assert reasons[0].startswith("rank already joined from 127.0.0.1:"), reasons
    assert reasons[1:3] == ["rank out of range 1..1"] * 2, reasons
    assert reasons[3] == "group of 3 nodes, not 2", reasons
    assert reasons[4].startswith("no hello"), reasons
    # Refusing is no loss: the group is whole and serves.
    assert health(pods[0].url) == (200, "")
    assert completion_status(pods[0].url) == 200
    assert leader.events("rank lost") == []


def test_the_leader_gone_ends_its_rank(start: Start) -> None:
    pods = local_group(DP_GROUP)
    leader, worker = join_group(start, pods)
    leader.signal(signal.SIGTERM)
    assert leader.wait_exit() == 0
    assert worker.wait_exit() == ranks.EXIT_LEADER_LOST
    assert worker.wait_event("leader lost")["rank"] == 1


def test_a_rank_gives_up_when_its_leader_never_listens(start: Start) -> None:
    _leader_pod, worker_pod = local_group(DP_GROUP)
    started = time.monotonic()
    worker = start_pod(start, worker_pod, **{ranks.ENV_RENDEZVOUS_SECONDS: "1"})
    assert worker.wait_exit() == ranks.EXIT_LEADER_UNREACHABLE
    assert time.monotonic() - started < BOUND
    assert worker.wait_event("leader unreachable")["rendezvous"].startswith(f"{LOOPBACK}:")


def test_a_three_node_tp_group_needs_every_rank_and_loses_all_with_one(start: Start) -> None:
    pods = local_group(TP_GROUP, tp=3)
    leader = start_pod(start, pods[0])
    rank1 = start_pod(start, pods[1])
    assert leader.wait_event("rank joined")["rank"] == 1
    # One of two ranks is not a group.
    assert health(pods[0].url) == (503, "engine starting")
    assert completion_status(pods[0].url) == 503
    rank2 = start_pod(start, pods[2])
    assert sorted(leader.wait_event("group complete")["ranks"]) == ["1", "2"]
    wait_health(pods[0].url, lambda s, _: s == 200, "200")
    assert completion_status(pods[0].url) == 200

    # Rank 2 crashes: the leader dies and exits, and with it goes rank 1.
    rank2.signal(signal.SIGKILL)
    assert wait_health(pods[0].url, lambda s, _: s != 200, "fails") == (503, "engine dead")
    assert leader.wait_exit() == ranks.EXIT_ENGINE_DEAD
    assert rank1.wait_exit() == ranks.EXIT_LEADER_LOST


def test_a_refusal_knob_exits_as_the_launcher_does(start: Start, tmp_path: Path) -> None:
    """PDMTP_EMULATOR_REFUSE: the launcher's one-line termination message and exit 3, from a
    single-node pod's rendered args, before anything listens (the kind tier's rollback step)."""
    pod = single_node_pod()
    log = tmp_path / "termination-log"
    argv = with_values(
        container(pod)["args"], {"--host": LOOPBACK, "--port": str(free_ports(1)[0])}
    )
    env = {**plain_env(pod), "HOSTNAME": pod["metadata"]["name"]}
    env.pop("PDMTP_METRICS_PORT")
    emulator = start(
        "refusing",
        argv,
        env,
        PDMTP_EMULATOR_REFUSE="lookahead mismatch: operator expects 2, vLLM computes 1",
        PDMTP_TERMINATION_LOG=str(log),
    )
    assert emulator.wait_exit() == 3
    assert log.read_text() == (
        "pdmtp-engine refused to start: lookahead mismatch: operator expects 2, vLLM computes 1\n"
    )
