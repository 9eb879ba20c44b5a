"""Multi-node replicas: how the pods of one group meet, as a vLLM engine's ranks do.

One replica of a role may be a group of pods, one per node (the operator's `multiNode`). Its
args say which node a pod is, in one of two layouts:
- DataParallel: `--data-parallel-size D --data-parallel-size-local L --data-parallel-address A
  --data-parallel-rpc-port P`, and on the other nodes `--headless --data-parallel-start-rank R`;
  the group has D / L nodes and this pod is node R / L;
- TensorParallel: `--nnodes N --node-rank r --master-addr A --master-port P`, `--headless` on
  rank > 0.

Node 0, the leader, serves the API and listens on P at `--host`; every other node is a headless
rank that dials A:P and says who it is in one line of JSON, `{"rank": r, "nodes": N}`. The leader
answers `{"joined": r}` and both hold the connection; it closes the connection without an answer
to a rank out of range, a rank that already joined, a different group size, or any rank once its
engine is dead (each logged as "rank refused"). Until every rank has joined the leader's engine
is "starting" (not Ready, generation refused); once one goes away it is "dead" for good (vLLM
ranks cannot rejoin a running engine) and the leader exits non-zero shortly after (serve.py), so
the kubelet restarts it and the operator replaces the group.

A headless rank serves no HTTP. It retries while the leader's name does not resolve or its port
refuses (the leader may start later), up to PDMTP_EMULATOR_RENDEZVOUS_SECONDS (default 600), then
exits EXIT_LEADER_UNREACHABLE; refused, it exits EXIT_REFUSED; when the leader goes away it exits
EXIT_LEADER_LOST (a rank whose engine died); on SIGTERM it exits 0. Every event is a JSON line on
stdout. This module must not know the engine: the leader reports its state through a callback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Layout = Literal["DataParallel", "TensorParallel"]
EngineState = Literal["starting", "serving", "dead"]
"""What the leader's engine can do (engine.EngineEmulator.state): "starting" until every rank has
joined, then "serving"; "dead" once one is lost. A single-node engine is always "serving"."""

EXIT_LEADER_UNREACHABLE = 3
EXIT_REFUSED = 4
EXIT_LEADER_LOST = 5
EXIT_ENGINE_DEAD = 6
"""The leader, once a rank of its engine was lost (serve.py)."""

ENV_RENDEZVOUS_SECONDS = "PDMTP_EMULATOR_RENDEZVOUS_SECONDS"
ENV_DEAD_EXIT_SECONDS = "PDMTP_EMULATOR_DEAD_EXIT_SECONDS"
DEFAULT_RENDEZVOUS_SECONDS = 600.0
DEFAULT_DEAD_EXIT_SECONDS = 2.0
# vLLM's defaults for the two rendezvous ports.
DEFAULT_DP_RPC_PORT = 29550
DEFAULT_MASTER_PORT = 29501
RETRY_SECONDS = 0.5
HELLO_SECONDS = 10.0
"""How long either side waits for the other's line once connected."""


def log(msg: str, **fields: Any) -> None:
    print(json.dumps({"msg": msg, **fields}), flush=True)


def seconds_from(env: Mapping[str, str], var: str, default: float) -> float:
    raw = env.get(var, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"{var}={raw!r} is not a number of seconds") from None
    if value < 0:
        raise SystemExit(f"{var}={raw!r} is negative")
    return value


@dataclass(frozen=True)
class Group:
    """This pod's place in its group: which node it is of how many, and where node 0 listens."""

    layout: Layout
    nodes: int
    node_rank: int
    address: str
    port: int

    @property
    def leader(self) -> bool:
        return self.node_rank == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "nodes": self.nodes,
            "node_rank": self.node_rank,
            "rendezvous": f"{self.address}:{self.port}",
        }


def add_group_args(parser: argparse.ArgumentParser) -> None:
    """The `vllm serve` flags that place a pod in a multi-node group."""
    parser.add_argument("--data-parallel-size", type=int, default=1)
    parser.add_argument("--data-parallel-size-local", type=int, default=None)
    parser.add_argument("--data-parallel-start-rank", type=int, default=0)
    parser.add_argument("--data-parallel-address", default=None)
    parser.add_argument("--data-parallel-rpc-port", type=int, default=DEFAULT_DP_RPC_PORT)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default=None)
    parser.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT)
    parser.add_argument("--headless", action="store_true")


def group_from(args: argparse.Namespace, env: Mapping[str, str]) -> Group | None:
    """The group the args place this pod in (None: a single-node pod); SystemExit when the args
    contradict themselves or the operator's PDMTP_GROUP_SIZE / PDMTP_GROUP_RANK."""
    size, local = args.data_parallel_size, args.data_parallel_size_local or args.data_parallel_size
    if size < 1 or local < 1 or size % local or args.data_parallel_start_rank % local:
        raise SystemExit(
            f"--data-parallel-size {size} / --data-parallel-size-local {local} / "
            f"--data-parallel-start-rank {args.data_parallel_start_rank}: not whole nodes"
        )
    dp_nodes = size // local
    if dp_nodes > 1 and args.nnodes > 1:
        raise SystemExit("both --data-parallel-size-local and --nnodes span nodes: one layout")
    group: Group | None = None
    if dp_nodes > 1:
        group = Group(
            "DataParallel",
            dp_nodes,
            args.data_parallel_start_rank // local,
            args.data_parallel_address or "",
            args.data_parallel_rpc_port,
        )
    elif args.nnodes > 1:
        group = Group(
            "TensorParallel", args.nnodes, args.node_rank, args.master_addr or "", args.master_port
        )
    nodes, rank = (group.nodes, group.node_rank) if group else (1, 0)
    if group is not None:
        if not group.address:
            raise SystemExit(f"a {group.layout} group needs the leader's address")
        if not 0 <= rank < nodes:
            raise SystemExit(f"node rank {rank} is not one of {nodes} nodes")
    if args.headless != (rank > 0):
        raise SystemExit(f"node rank {rank} with headless={args.headless}: only ranks > 0 are")
    for var, want in (("PDMTP_GROUP_SIZE", nodes), ("PDMTP_GROUP_RANK", rank)):
        if env.get(var) and env[var] != str(want):
            raise SystemExit(f"{var}={env[var]} but the args say {want}")
    return group


def _keepalive(writer: asyncio.StreamWriter) -> None:
    """Notice a peer whose node vanished without closing the connection (no FIN, no RST)."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _peer(writer: asyncio.StreamWriter) -> str:
    addr = writer.get_extra_info("peername")
    return f"{addr[0]}:{addr[1]}" if addr else "?"


# ---- the leader ------------------------------------------------------------------------------


@dataclass
class Rendezvous:
    """Node 0's side: the rendezvous port, the ranks that joined, and the engine's state."""

    group: Group
    host: str
    on_state: Callable[[EngineState], None]
    state: EngineState = "starting"
    joined: dict[int, str] = field(default_factory=dict)
    """Rank -> its peer address ("host:port"), for every rank that ever joined."""
    dead: asyncio.Event = field(default_factory=asyncio.Event)
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _closing: bool = False

    async def start(self) -> None:
        self.on_state(self.state)
        self._server = await asyncio.start_server(
            self._handle, self.host, self.group.port, reuse_address=True
        )

    async def close(self) -> None:
        """Stop listening and let go of the ranks (they exit, as vLLM's do without node 0)."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    def _set(self, state: EngineState) -> None:
        self.state = state
        self.on_state(state)

    def _refusal(self, rank: int, nodes: int) -> str | None:
        if self.state == "dead":
            return "engine dead"
        if nodes != self.group.nodes:
            return f"group of {nodes} nodes, not {self.group.nodes}"
        if not 0 < rank < self.group.nodes:
            return f"rank out of range 1..{self.group.nodes - 1}"
        if rank in self.joined:
            return f"rank already joined from {self.joined[rank]}"
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        self._writers.add(writer)
        try:
            try:
                hello = json.loads(await asyncio.wait_for(reader.readline(), HELLO_SECONDS))
                rank, nodes = int(hello["rank"]), int(hello["nodes"])
            except (TimeoutError, OSError, ValueError, KeyError, TypeError) as exc:
                log("rank refused", peer=peer, reason=f"no hello: {exc!r}")
                return
            why = self._refusal(rank, nodes)
            if why is not None:
                log("rank refused", rank=rank, peer=peer, reason=why)
                return
            self.joined[rank] = peer
            _keepalive(writer)
            writer.write(json.dumps({"joined": rank}).encode() + b"\n")
            await writer.drain()
            log("rank joined", rank=rank, peer=peer, nodes=self.group.nodes)
            if len(self.joined) == self.group.nodes - 1 and self.state == "starting":
                log("group complete", nodes=self.group.nodes, ranks=self.joined)
                self._set("serving")
            with contextlib.suppress(OSError):
                while await reader.read(4096):  # a rank sends nothing more; EOF is its end
                    pass
            if not self._closing:
                log("rank lost", rank=rank, peer=peer)
                self.die(f"rank {rank} ({peer}) lost")
        finally:
            self._writers.discard(writer)
            writer.close()

    def die(self, reason: str) -> None:
        if self.state == "dead":
            return
        self._set("dead")
        log("engine dead", reason=reason)
        self.dead.set()


# ---- a headless rank -------------------------------------------------------------------------


async def _connect(
    group: Group, deadline: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """Dial the leader until it answers (None once the deadline passes)."""
    last = ""
    while True:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(group.address, group.port), HELLO_SECONDS
            )
        except (OSError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                log("leader unreachable", rendezvous=f"{group.address}:{group.port}", error=error)
                return None
            if error != last:  # one line per new reason, not one per attempt
                log(
                    "waiting for the leader",
                    rendezvous=f"{group.address}:{group.port}",
                    error=error,
                )
                last = error
            await asyncio.sleep(RETRY_SECONDS)


async def join(group: Group, pod: str, rendezvous_seconds: float) -> int:
    """Join the leader and hold on until it goes away. Returns the exit code."""
    connected = await _connect(group, time.monotonic() + rendezvous_seconds)
    if connected is None:
        return EXIT_LEADER_UNREACHABLE
    reader, writer = connected
    leader = _peer(writer)
    try:
        _keepalive(writer)
        writer.write(json.dumps({"rank": group.node_rank, "nodes": group.nodes}).encode() + b"\n")
        await writer.drain()
        try:
            answer = json.loads(await asyncio.wait_for(reader.readline(), HELLO_SECONDS))
            accepted = answer.get("joined") == group.node_rank
        except (TimeoutError, OSError, ValueError, AttributeError):
            accepted = False
        if not accepted:
            log("refused by the leader", rank=group.node_rank, leader=leader)
            return EXIT_REFUSED
        log("joined the leader", rank=group.node_rank, leader=leader, pod=pod)
        with contextlib.suppress(OSError):
            while await reader.read(4096):
                pass
        log("leader lost", rank=group.node_rank, leader=leader)
        return EXIT_LEADER_LOST
    finally:
        writer.close()


async def run_rank(group: Group, pod: str, env: Mapping[str, str]) -> int:
    """A headless rank's main coroutine: join; SIGTERM (after the kubelet's preStop) ends it."""
    rendezvous_seconds = seconds_from(env, ENV_RENDEZVOUS_SECONDS, DEFAULT_RENDEZVOUS_SECONDS)
    log("headless rank", pod=pod, **group.as_dict())
    task = asyncio.create_task(join(group, pod, rendezvous_seconds))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        log("stopping", rank=group.node_rank)
        return 0
