"""A bounded request loop against a PDDeployment's client Service, run inside the cluster.

`concurrency` clients send completions through the Service until `max_requests` have been sent,
`max_seconds` have passed, or `stop_file` appears (the test creates it when the rollout it is
watching has finished). Every request opens a new connection, so each one goes through the
Service's load balancing afresh, as independent clients do. The decode's answer names the
prefill (pod, revision, MTP k) whose KV it used (see engine.py); a request counts as:

- failed          anything but HTTP 200 with that provenance (connection errors included);
- cross_revision  answered, but the decode and the prefill belong to different revisions, or
                  ran different speculative token counts.

With `--request-classes code=1,chat=1` each request is of a class drawn by those weights (seeded
per client, so a run is repeatable), named in its prompt as `[class=code]`: an emulated decode
with PDMTP_EMULATOR_CLASS_ACCEPTANCE accepts that class's share of draft tokens, so the verdict
sees mixed traffic, as real clients' requests that draft well and poorly mix.

Progress lines and a final summary are JSON on stdout; the summary is the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

ERROR_SAMPLES = 20


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    cross_revision: int = 0
    pairs: Counter[str] = field(default_factory=Counter)
    classes: Counter[str] = field(default_factory=Counter)
    """Requests sent per request class (none without --request-classes)."""
    errors: list[str] = field(default_factory=list)
    first_at: float | None = None
    last_at: float | None = None

    def fail(self, why: str) -> None:
        self.failed += 1
        if len(self.errors) < ERROR_SAMPLES:
            self.errors.append(why)

    def summary(self, started: float, stopped_by: str) -> dict[str, Any]:
        return {
            "summary": True,
            "sent": self.sent,
            "ok": self.ok,
            "failed": self.failed,
            "cross_revision": self.cross_revision,
            # "decode-revision<-prefill-revision k=..": how many answers each pairing gave.
            "pairs": dict(self.pairs),
            "classes": dict(self.classes),
            "errors": self.errors,
            "seconds": round(time.monotonic() - started, 3),
            "stopped_by": stopped_by,
        }


def judge(tally: Tally, status: int, body: Any) -> None:
    if status != 200:
        tally.fail(f"HTTP {status}: {str(body)[:300]}")
        return
    try:
        kv = json.loads(body["choices"][0]["text"])["kv"]
        decode, prefill = kv["decode"], kv["prefill"]
    except (KeyError, IndexError, TypeError, ValueError):
        tally.fail(f"no KV provenance in {str(body)[:300]}")
        return
    tally.ok += 1
    pair = (
        f"{decode['revision']}<-{prefill['revision']} "
        f"k={decode['speculative_tokens']}<-{prefill['speculative_tokens']}"
    )
    tally.pairs[pair] += 1
    if (
        decode["revision"] != prefill["revision"]
        or decode["speculative_tokens"] != prefill["speculative_tokens"]
        or not decode["revision"]
    ):
        tally.cross_revision += 1


async def client(
    n: int,
    args: argparse.Namespace,
    tally: Tally,
    deadline: float,
    stop: asyncio.Event,
) -> None:
    classes = parse_weights(args.request_classes)
    pick = random.Random(f"{args.seed}-{n}")
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    # force_close: a fresh connection (and Service pick) per request.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        while not stop.is_set() and time.monotonic() < deadline:
            if tally.sent >= args.max_requests:
                stop.set()
                break
            tally.sent += 1
            i = tally.sent
            prompt = f"client {n} request {i}"
            if classes:
                name = pick.choices(list(classes), weights=list(classes.values()))[0]
                tally.classes[name] += 1
                prompt = f"[class={name}] {prompt}"
            body = {"model": "emulated/model", "prompt": prompt, "max_tokens": args.max_tokens}
            now = time.monotonic()
            tally.first_at = tally.first_at or now
            try:
                async with session.post(args.url, json=body) as resp:
                    try:
                        payload: Any = await resp.json(content_type=None)
                    except ValueError:
                        payload = await resp.text()
                    judge(tally, resp.status, payload)
            except (TimeoutError, aiohttp.ClientError) as exc:
                tally.fail(f"{type(exc).__name__}: {exc}")
            tally.last_at = time.monotonic()
            await asyncio.sleep(args.interval)


def parse_weights(text: str) -> dict[str, float]:
    """`code=1,chat=3` -> the request classes and their weights ({} for "")."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, weight = item.partition("=")
        if not sep or not name.strip() or float(weight) <= 0:
            raise SystemExit(f"--request-classes takes NAME=WEIGHT,..., got {item!r}")
        out[name.strip()] = float(weight)
    return out


async def watch_stop_file(path: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if path and os.path.exists(path):
            stop.set()
            return
        await asyncio.sleep(0.2)


async def progress(tally: Tally, started: float, stop: asyncio.Event, every: float) -> None:
    while not stop.is_set():
        await asyncio.sleep(every)
        line = {
            "progress": True,
            "sent": tally.sent,
            "ok": tally.ok,
            "failed": tally.failed,
            "seconds": round(time.monotonic() - started, 1),
            # The first failures, so a test that sees the count move can say why.
            "errors": tally.errors,
        }
        print(json.dumps(line), flush=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tally = Tally()
    stop = asyncio.Event()
    started = time.monotonic()
    deadline = started + args.max_seconds
    watchers = [
        asyncio.create_task(watch_stop_file(args.stop_file, stop)),
        asyncio.create_task(progress(tally, started, stop, args.progress_every)),
    ]
    await asyncio.gather(*(client(n, args, tally, deadline, stop) for n in range(args.concurrency)))
    if os.path.exists(args.stop_file or "/nonexistent"):
        stopped_by = "stop file"
    elif tally.sent >= args.max_requests:
        stopped_by = "max requests"
    else:
        stopped_by = "max seconds"
    stop.set()
    for task in watchers:
        task.cancel()
    return tally.summary(started, stopped_by)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pdmtp-emulator load", description=__doc__)
    parser.add_argument("--url", required=True, help="e.g. http://demo/v1/completions")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-requests", type=int, default=5000)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--interval", type=float, default=0.05, help="pause per client per request")
    parser.add_argument("--request-timeout", type=float, default=10.0)
    parser.add_argument("--stop-file", default="/tmp/stop")
    parser.add_argument("--progress-every", type=float, default=2.0)
    parser.add_argument("--max-tokens", type=int, default=4, help="tokens each request asks for")
    parser.add_argument(
        "--request-classes",
        default="",
        help="NAME=WEIGHT,...: each request of a class drawn by weight, named in its prompt",
    )
    parser.add_argument("--seed", type=int, default=0, help="of the request classes' draws")
    args = parser.parse_args(argv)
    summary = asyncio.run(run(args))
    print(json.dumps(summary, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
