"""Kill one engine of a 2P/2D set under a bounded request loop and count what each router lost.

Used by test_router_failover.py, and runnable on its own to compare router flag sets (the figures
in docs/benchmarks.md, "Router retries (issue 31)"):

    .venv/bin/python tests/router/failover.py            # every variant in VARIANTS, both roles

Each run starts fresh emulated engines on 127.0.0.1 (decodes pull their KV from the prefill a
request names, as vLLM's Mooncake decoder does), one router per variant plus the baseline over
the same engines, and a loop of CLIENTS threads sending each router in turn: WARMUP_S of traffic,
then the victim is killed (listeners closed and the requests it holds dropped at once, as a
SIGKILL), then AFTER_KILL_S and at least MIN_AFTER_KILL requests per router more. Every router
sees the same death under the same load.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the import roots pytest gives the test tree
    _TESTS = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(_TESTS), str(_TESTS.parent / "hack" / "lib")]

from loopback import free_ports
from pdmtp.core.render.router import ROUTER_HEALTH_FLAGS, static_router_args
from router.emulator import EngineEmulator
from router.harness import (
    LOOPBACK,
    RouterProcess,
    completion_body,
    find_router_binary,
    post,
    without_flags,
)

CLIENTS = 4
WARMUP_S = 1.5
"""Traffic before the kill, so every router is past start-up and its health checker runs."""
AFTER_KILL_S = 6.0
"""Traffic after it: long enough that a router that never skips the dead engine stands out ..."""
MIN_AFTER_KILL = 60
"""... and at least this many requests per router after it (a loaded machine is slow) ..."""
MAX_AFTER_KILL_S = 30.0
"""... but never longer than this."""
REQUEST_CAP = 6000

RETRY_AND_BREAKER = (
    "--retry-max-retries",
    "3",
    "--retry-initial-backoff-ms",
    "10",
    "--cb-failure-threshold",
    "1",
    "--cb-timeout-duration-secs",
    "30",
)
"""Retries and a circuit breaker that opens at the first failure: what one would try first."""

VARIANTS: dict[str, tuple[str, ...]] = {
    "retries 3, circuit breaker at 1 failure": RETRY_AND_BREAKER,
    "health 1 s x 3 failures": (
        "--health-check-interval-secs",
        "1",
        "--health-failure-threshold",
        "3",
        "--health-check-timeout-secs",
        "2",
    ),
    "health 1 s x 2 failures": (
        "--health-check-interval-secs",
        "1",
        "--health-failure-threshold",
        "2",
        "--health-check-timeout-secs",
        "2",
    ),
}
"""Flag sets added to the baseline (the rendered args without ROUTER_HEALTH_FLAGS) in a sweep;
"rendered" (the operator's args as they are) is always run too."""


@dataclass(frozen=True)
class Outcome:
    router: str
    sent: float
    status: int
    """The HTTP status; -1 when the client's own connection to the router failed."""
    body: bytes


@dataclass
class Run:
    outcomes: list[Outcome]
    killed_at: float

    def of(self, router: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.router == router]

    def failed(self, router: str) -> list[Outcome]:
        return [o for o in self.of(router) if o.status != 200]

    def summary(self, router: str) -> dict[str, Any]:
        failed = self.failed(router)
        return {
            "requests": len(self.of(router)),
            "failed": len(failed),
            "in_flight_at_kill": sum(o.sent < self.killed_at for o in failed),
            "last_failure_s_after_kill": round(max(o.sent for o in failed) - self.killed_at, 2)
            if failed
            else None,
        }


def load_loop(bases: Mapping[str, str], kill: Callable[[], None]) -> Run:
    """CLIENTS threads, each sending to every router in turn: WARMUP_S before `kill()`, then
    AFTER_KILL_S and MIN_AFTER_KILL requests per router after it (at most MAX_AFTER_KILL_S), at
    most REQUEST_CAP requests in all."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    killed = [float("inf")]
    names = sorted(bases)

    def done() -> bool:
        now, at = time.monotonic(), killed[0]
        if len(outcomes) >= REQUEST_CAP or now >= at + MAX_AFTER_KILL_S:
            return True
        if now < at + AFTER_KILL_S:
            return False
        after = Counter(o.router for o in outcomes if o.sent > at)
        return all(after[n] >= MIN_AFTER_KILL for n in names)

    def client(offset: int) -> None:
        i = offset
        while True:
            with lock:
                if done():
                    return
            name = names[i % len(names)]
            i += 1
            sent = time.monotonic()
            try:
                reply = post(bases[name], "/v1/completions", completion_body(max_tokens=8))
                status, body = reply.status, reply.body
            except (OSError, urllib.error.URLError) as e:
                status, body = -1, repr(e).encode()
            with lock:
                outcomes.append(Outcome(name, sent, status, body[:300]))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    time.sleep(WARMUP_S)
    killed_at = time.monotonic()
    with lock:
        killed[0] = killed_at
    kill()
    for t in threads:
        t.join(timeout=MAX_AFTER_KILL_S + 30)
    assert not any(t.is_alive() for t in threads)
    return Run(sorted(outcomes, key=lambda o: o.sent), killed_at)


def sweep(variants: Mapping[str, Sequence[str]], roles: Sequence[str]) -> None:
    """Print one JSON line per (victim role, router): what it lost."""
    binary, why = find_router_binary()
    if binary is None:
        raise SystemExit(why)
    for role in roles:
        prefills = [EngineEmulator("prefill", f"p{i}", shutdown_timeout=0.0) for i in range(2)]
        decodes = [
            EngineEmulator("decode", f"d{i}", shutdown_timeout=0.0, pull_kv=True) for i in range(2)
        ]
        engines = [e.start() for e in (*prefills, *decodes)]
        routers: dict[str, RouterProcess] = {}
        try:
            for name, extra in {"rendered": None, "baseline": (), **variants}.items():
                port, metrics_port = free_ports(2)
                args = static_router_args(
                    prefills=[(p.url, p.bootstrap_port) for p in prefills],
                    decodes=[d.url for d in decodes],
                    policy="round_robin",
                    host=LOOPBACK,
                    port=port,
                    metrics_host=LOOPBACK,
                    metrics_port=metrics_port,
                )
                if extra is not None:
                    args = [*without_flags(args, ROUTER_HEALTH_FLAGS), *extra]
                routers[name] = RouterProcess(binary, args, port, metrics_port).start()
            victim = prefills[0] if role == "prefill" else decodes[0]
            run = load_loop({n: r.base for n, r in routers.items()}, victim.stop)
            for name in routers:
                print(json.dumps({"killed": role, "router": name, **run.summary(name)}), flush=True)
        finally:
            for r in routers.values():
                r.stop()
            for e in engines:
                e.stop()


if __name__ == "__main__":
    sweep(VARIANTS, ["prefill", "decode"])
