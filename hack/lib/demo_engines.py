"""What the demo's decode engines would export (`make demo`). KWOK's pods run nothing and their
IPs are never dialled, so the demo's operator reads engine metrics from files
(`pdmtp run --metrics-source dir:DIR`), and this process writes them: every second, for each
decode pod of the namespace, the counters the engine image's decode publishes.

Each pod's counters follow from its own spec, as a real engine's follow from its config:
- it pulls `--requests` requests' KV a second, each with the prefill backoff its pod was rendered
  for (`PDMTP_EXPECTED_PREFILL_BACKOFF`: what the fixed connector applies);
- each request makes `--drafts` drafts of k tokens (`num_speculative_tokens` of its
  `--speculative-config`), and each draft token is accepted with the pod's
  `PDMTP_EMULATOR_ACCEPTANCE_RATE` (the emulator's knob, 0.7 unset), drawn at random, so that
  scrape windows vary as live traffic's do.

A pod whose env sets the knob lower drafts worse: that is how the demo shows a release being
rolled back on its verdict.

    python hack/lib/demo_engines.py --kubeconfig K --namespace default --dir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from pdmtp.api.vocabulary import ENV_EXPECTED_BACKOFF, LABEL_ROLE
from pdmtp.scrape import DirectorySource

ACCEPTANCE_KNOB = "PDMTP_EMULATOR_ACCEPTANCE_RATE"
DEFAULT_ACCEPTANCE = 0.7  # the emulator's default (pdmtp_emulator.scheduler.Tuning)
TOKENS_PER_PULL = 64


@dataclass
class Engine:
    """One decode pod's counters, grown a tick at a time."""

    backoff: int
    k: int
    acceptance: float
    requests: int = 0
    drafts: int = 0
    accepted: int = 0

    def tick(self, requests: int, drafts: int, rng: random.Random) -> None:
        self.requests += requests
        made = requests * drafts
        self.drafts += made
        self.accepted += sum(rng.random() < self.acceptance for _ in range(made * self.k))

    def text(self) -> str:
        series = {
            "pdmtp:kv_pulled_requests": self.requests,
            "pdmtp:kv_pulled_tokens": self.requests * TOKENS_PER_PULL,
            "pdmtp:kv_backoff_tokens": self.requests * self.backoff,
            "pdmtp:kv_decode_only_requests": 0,
            "vllm:mooncake_num_failed_recvs": 0,
            "vllm:spec_decode_num_drafts": self.drafts,
            "vllm:spec_decode_num_accepted_tokens": self.accepted,
        }
        labels = '{model_name="demo",engine="0"}'
        return "".join(
            f"# TYPE {name}_total counter\n{name}_total{labels} {value}\n"
            for name, value in series.items()
        )


def engine_of(pod: Any) -> Engine | None:
    """The engine a decode pod's spec describes; None if it names no speculative config."""
    container = pod.spec.containers[0]
    env = {e.name: e.value for e in container.env or [] if e.value is not None}
    args = list(container.args or [])
    if "--speculative-config" not in args:
        return None
    speculative = json.loads(args[args.index("--speculative-config") + 1])
    return Engine(
        backoff=int(env.get(ENV_EXPECTED_BACKOFF, "0")),
        k=int(speculative["num_speculative_tokens"]),
        acceptance=float(env.get(ACCEPTANCE_KNOB, DEFAULT_ACCEPTANCE)),
    )


def publish(root: Path, namespace: str, pod: str, text: str) -> None:
    """Write what `pod` exports where `--metrics-source dir:ROOT` reads it, whole, as
    `DirectorySource` asks of a writer (the cluster tier's harness writes with this too)."""
    path = DirectorySource(root).path_of(namespace, pod)
    part = path.with_name(f".{path.name}.{threading.get_ident()}")
    part.write_text(text)
    os.replace(part, path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--dir", type=Path, required=True, help="the operator's metrics dir")
    parser.add_argument("--requests", type=int, default=4, help="pulled a second per decode")
    parser.add_argument("--drafts", type=int, default=8, help="drafts per request")
    parser.add_argument("--max-seconds", type=float, default=4 * 3600, help="then stop")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    api = client.CoreV1Api(config.new_client_from_config(config_file=args.kubeconfig))
    (args.dir / args.namespace).mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    engines: dict[str, Engine] = {}  # by pod uid: a replaced pod starts from zero
    deadline = time.monotonic() + args.max_seconds
    while time.monotonic() < deadline:
        try:
            pods = api.list_namespaced_pod(
                args.namespace, label_selector=f"{LABEL_ROLE}=decode", _request_timeout=10
            ).items
        except Exception as e:  # the control plane restarting: try again next tick
            print(f"listing pods: {e}", file=sys.stderr)
            pods = []
        for pod in pods:
            if not any(
                c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
            ):
                continue  # an engine serves nothing before it is Ready
            engine = engines.get(pod.metadata.uid) or engine_of(pod)
            if engine is None:
                continue
            engines[pod.metadata.uid] = engine
            engine.tick(args.requests, args.drafts, rng)
            publish(args.dir, args.namespace, pod.metadata.name, engine.text())
        time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
