"""The emulator as a PDDeployment engine pod's main process.

The operator renders an engine container's args as a `vllm serve` command line and its env
(PDMTP_ROLE, VLLM_HOST_IP from the downward API, VLLM_MOONCAKE_BOOTSTRAP_PORT); this reads the
same, so the emulator image drops in where the engine image goes. What it takes from them:
`--host`/`--port` (where to listen), `--speculative-config` (its MTP k, reported as provenance),
`--kv-transfer-config` (its kv_role must agree with PDMTP_ROLE), `--shutdown-timeout` (on SIGTERM
it stops listening and finishes the requests it holds for up to that long, as vLLM does).
Everything else vLLM would use (model, dtype, parallelism) is accepted and ignored. With
PDMTP_METRICS_PORT set it also serves the metrics-only listener the engine launcher serves there.

Its speed is the emulator's own env (scheduler.ENV; the role's `env` in a PDDeployment):
PDMTP_EMULATOR_MAX_RUNNING (requests run at once, default 8), PDMTP_EMULATOR_ACCEPTANCE_RATE
(MTP draft tokens accepted, 0..1, default 0.7), PDMTP_EMULATOR_STEP_SECONDS and
PDMTP_EMULATOR_PREFILL_SECONDS (default 0.005 each), PDMTP_EMULATOR_BATCH_SLOWDOWN (default
0.5); `POST /emulator/config` changes them later without a restart.

Its revision is read from the pod name, which the Deployment controller derives from the
operator's workload name `<pdd>-<revision>-<role>` plus the ReplicaSet hash and a random suffix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys

from pdmtp_emulator.engine import EngineEmulator, Identity, Role
from pdmtp_emulator.scheduler import Tuning

KV_ROLES: dict[str, Role] = {"kv_producer": "prefill", "kv_consumer": "decode"}
DEFAULT_BOOTSTRAP_PORT = 8998
WORKER_PORT = 17000
"""The prefill's transfer worker (Mooncake picks random ports; a fixed one is easier to read)."""


def revision_from_pod_name(pod: str, role: str) -> str:
    """`<pdd>-<revision>-<role>-<replicaset hash>-<suffix>` -> `<revision>` ('' if not that)."""
    parts = pod.split("-")
    if len(parts) >= 5 and parts[-3] == role:
        return parts[-4]
    return ""


def parse_vllm_serve(argv: list[str]) -> argparse.Namespace:
    if argv[:2] != ["vllm", "serve"] or len(argv) < 3:
        raise SystemExit(f"expected `vllm serve MODEL ...`, got {argv[:3]}")
    parser = argparse.ArgumentParser(prog="vllm serve", add_help=False)
    parser.add_argument("model")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--speculative-config", default=None)
    parser.add_argument("--kv-transfer-config", default=None)
    parser.add_argument("--shutdown-timeout", type=float, default=0.0)
    args, _ignored = parser.parse_known_args(argv[2:])
    return args


def engine_from(argv: list[str], env: dict[str, str], pod: str) -> EngineEmulator:
    args = parse_vllm_serve(argv)
    role = env.get("PDMTP_ROLE", "")
    if role not in ("prefill", "decode"):
        raise SystemExit(f"PDMTP_ROLE must be prefill or decode, got {role!r}")
    kv = json.loads(args.kv_transfer_config) if args.kv_transfer_config else {}
    kv_role = KV_ROLES.get(kv.get("kv_role", ""))
    if kv_role != role:
        raise SystemExit(f"--kv-transfer-config kv_role {kv.get('kv_role')!r} is not a {role}")
    spec = json.loads(args.speculative_config) if args.speculative_config else None
    k = int(spec["num_speculative_tokens"]) if spec else None
    identity = Identity(pod=pod, revision=revision_from_pod_name(pod, role), speculative_tokens=k)
    try:
        tuning = Tuning.from_env(env)
    except ValueError as exc:
        raise SystemExit(f"emulator settings: {exc}") from None
    return EngineEmulator(
        role=role,
        name=pod,
        host=args.host,
        http_port=args.port,
        bootstrap_port=int(env.get("VLLM_MOONCAKE_BOOTSTRAP_PORT", DEFAULT_BOOTSTRAP_PORT)),
        worker_port=WORKER_PORT,
        advertise_host=env.get("VLLM_HOST_IP") or None,
        identity=identity,
        pull_kv=True,
        record_requests=False,
        shutdown_timeout=args.shutdown_timeout,
        metrics_port=int(env["PDMTP_METRICS_PORT"]) if env.get("PDMTP_METRICS_PORT") else None,
        tuning=tuning,
    )


async def run(engine: EngineEmulator) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await engine.serve()
    print(
        json.dumps(
            {
                "msg": "serving",
                "role": engine.role,
                "http_port": engine.http_port,
                "bootstrap_port": engine.bootstrap_port if engine.role == "prefill" else None,
                "metrics_port": engine.metrics_port,
                "engine_ids": engine.engine_ids,
                "identity": engine.identity.__dict__,
                "tuning": engine.tuning.as_dict(),
            }
        ),
        flush=True,
    )
    await stop.wait()
    # The kubelet ran the pod's preStop before this signal: stop listening, finish what is held.
    await engine.shutdown()


def main(argv: list[str]) -> int:
    engine = engine_from(argv, dict(os.environ), os.environ.get("HOSTNAME") or socket.gethostname())
    asyncio.run(run(engine))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
