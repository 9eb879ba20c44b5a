"""The emulator as a PDDeployment engine pod's main process.

The operator renders an engine container's args as a `vllm serve` command line and its env
(PDMTP_ROLE, VLLM_HOST_IP from the downward API, VLLM_MOONCAKE_BOOTSTRAP_PORT); this reads the
same, so the emulator image drops in where the engine image goes. What it takes from them:
`--host`/`--port` (where to listen), `--speculative-config` (its MTP k, reported as provenance),
`--kv-transfer-config` (its kv_role must agree with PDMTP_ROLE; a decode's kv_load_failure_policy,
vLLM's default fail, says what a failed pull does to its request), `--shutdown-timeout` (on SIGTERM
it stops listening and finishes the requests it holds for up to that long, as vLLM does).
Everything else vLLM would use (model, dtype, parallelism) is accepted and ignored. With
PDMTP_METRICS_PORT set it also serves the metrics-only listener the engine launcher serves there;
PDMTP_EMULATOR_METRICS_PORT moves that listener elsewhere (a decode the operator cannot scrape:
PDMTP_METRICS_PORT is the operator's, refused in a role's env).

Its speed is the emulator's own env (scheduler.ENV; the role's `env` in a PDDeployment):
PDMTP_EMULATOR_MAX_RUNNING (requests run at once, default 8), PDMTP_EMULATOR_ACCEPTANCE_RATE
(MTP draft tokens accepted, 0..1, default 0.7), PDMTP_EMULATOR_STEP_SECONDS and
PDMTP_EMULATOR_PREFILL_SECONDS (default 0.005 each), PDMTP_EMULATOR_BATCH_SLOWDOWN (default
0.5), PDMTP_EMULATOR_CLASS_ACCEPTANCE (per request class, e.g. `code=0.85,chat=0.55`: a request
whose prompt holds `[class=code]` accepts at 0.85); `POST /emulator/config` changes them later
without a restart.

Multi-node replicas (ranks.py): the DataParallel args (`--data-parallel-size`, `-size-local`,
`-start-rank`, `-address`, `-rpc-port`) or the TensorParallel ones (`--nnodes`, `--node-rank`,
`--master-addr`, `--master-port`), with `--headless` on every node but the first, place a pod in
its group; PDMTP_GROUP_SIZE and PDMTP_GROUP_RANK must agree with them. Node 0 serves as above and
listens on the rendezvous port at `--host`, not Ready until every rank has joined; once a rank is
lost its engine is dead and it exits ranks.EXIT_ENGINE_DEAD after PDMTP_EMULATOR_DEAD_EXIT_SECONDS
(default 2). A headless rank only joins node 0 (PDMTP_EMULATOR_RENDEZVOUS_SECONDS to reach it)
and serves nothing. A pod without those args is one engine, as before.

PDMTP_EMULATOR_REFUSE=<reason> makes it do what the engine image's launcher does when the
effective config contradicts what the operator expects: write `pdmtp-engine refused to start:
<reason>` to the termination-message file (PDMTP_TERMINATION_LOG, default /dev/termination-log)
and exit 3, before serving anything. The images tier proves the real launcher refuses so, with
the pod's own env and args; this lets the kind tier run the rest (the kubelet's report, the
operator's rollback) without loading the ~10 GB engine image.

Its revision is read from the pod name, which the Deployment controller derives from the
operator's workload name `<pdd>-<revision>-<role>` plus the ReplicaSet hash and a random suffix.
A group pod is named `<pdd>-<revision>-<role>-<group>-<rank>`, but its `hostname` is set, so
$HOSTNAME is only `<group>-<rank>`: the name is rebuilt with the pod's subdomain, the label after
the first dot of PDMTP_LEADER_ADDRESS (`g0-0.<pdd>-<revision>-<role>.<namespace>.svc`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Mapping

from pdmtp_emulator import ranks
from pdmtp_emulator.engine import EngineEmulator, Identity, Role
from pdmtp_emulator.handoff import LoadFailurePolicy
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


def pod_name(env: Mapping[str, str], hostname: str) -> str:
    """The pod's name: $HOSTNAME, or for a group pod `<subdomain>-<hostname>`."""
    labels = env.get("PDMTP_LEADER_ADDRESS", "").split(".")
    if env.get("PDMTP_GROUP") and len(labels) > 2 and labels[1]:
        subdomain = labels[1]
        if not hostname.startswith(f"{subdomain}-"):
            return f"{subdomain}-{hostname}"
    return hostname


def parse_vllm_serve(argv: list[str]) -> argparse.Namespace:
    if argv[:2] != ["vllm", "serve"] or len(argv) < 3:
        raise SystemExit(f"expected `vllm serve MODEL ...`, got {argv[:3]}")
    parser = argparse.ArgumentParser(prog="vllm serve", add_help=False, allow_abbrev=False)
    parser.add_argument("model")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--speculative-config", default=None)
    parser.add_argument("--kv-transfer-config", default=None)
    parser.add_argument("--shutdown-timeout", type=float, default=0.0)
    ranks.add_group_args(parser)
    args, _ignored = parser.parse_known_args(argv[2:])
    return args


def role_of(args: argparse.Namespace, env: Mapping[str, str]) -> Role:
    role = env.get("PDMTP_ROLE", "")
    if role not in ("prefill", "decode"):
        raise SystemExit(f"PDMTP_ROLE must be prefill or decode, got {role!r}")
    kv = json.loads(args.kv_transfer_config) if args.kv_transfer_config else {}
    kv_role = KV_ROLES.get(kv.get("kv_role", ""))
    if kv_role != role:
        raise SystemExit(f"--kv-transfer-config kv_role {kv.get('kv_role')!r} is not a {role}")
    return kv_role


def load_failure_policy(args: argparse.Namespace) -> LoadFailurePolicy:
    """The `--kv-transfer-config`'s kv_load_failure_policy; vLLM's default (fail) without one."""
    kv = json.loads(args.kv_transfer_config) if args.kv_transfer_config else {}
    policy = kv.get("kv_load_failure_policy", "fail")
    if policy not in ("recompute", "fail"):
        raise SystemExit(
            f"--kv-transfer-config kv_load_failure_policy {policy!r} is not one of vLLM's"
        )
    return "recompute" if policy == "recompute" else "fail"


def engine_from(argv: list[str], env: Mapping[str, str], pod: str) -> EngineEmulator:
    args = parse_vllm_serve(argv)
    role = role_of(args, env)
    spec = json.loads(args.speculative_config) if args.speculative_config else None
    k = int(spec["num_speculative_tokens"]) if spec else None
    backoff = env.get("PDMTP_EXPECTED_PREFILL_BACKOFF", "")
    identity = Identity(
        pod=pod,
        revision=revision_from_pod_name(pod, role),
        speculative_tokens=k,
        prefill_backoff=int(backoff) if backoff.isdigit() else None,
    )
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
        metrics_port=metrics_port(env),
        tuning=tuning,
        load_failure_policy=load_failure_policy(args),
    )


def metrics_port(env: Mapping[str, str]) -> int | None:
    """The metrics-only listener's port: the emulator's own knob, else the operator's."""
    port = env.get("PDMTP_EMULATOR_METRICS_PORT") or env.get("PDMTP_METRICS_PORT")
    return int(port) if port else None


async def run(
    engine: EngineEmulator, group: ranks.Group | None = None, dead_exit_seconds: float = 0.0
) -> int:
    """Serve until SIGTERM (0) or, for a group's leader, until its engine died (non-zero)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    rendezvous = None
    if group is not None:
        # Listening before the API does, so the API never answers as if the group were whole.
        def set_state(state: ranks.EngineState) -> None:
            engine.state = state

        rendezvous = ranks.Rendezvous(group, engine.host, set_state)
        await rendezvous.start()
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
                "group": group.as_dict() if group else None,
            }
        ),
        flush=True,
    )
    dead = rendezvous.dead if rendezvous else asyncio.Event()
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(dead.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    if not stop.is_set():
        # A rank died: vLLM's engine is gone and the server shuts itself down; a moment to let
        # the failures be seen (and the kubelet's probe fail), then out, with nothing to drain.
        ranks.log("exiting", code=ranks.EXIT_ENGINE_DEAD, after_seconds=dead_exit_seconds)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), dead_exit_seconds)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(engine.shutdown(), 1.0)
    else:
        # The kubelet ran the pod's preStop before this signal: stop listening, finish what
        # is held (a rank lost meanwhile still kills the engine, and the exit code says so).
        await engine.shutdown()
    for task in waits:
        task.cancel()
    if rendezvous is not None:
        await rendezvous.close()
    return ranks.EXIT_ENGINE_DEAD if engine.state == "dead" else 0


EXIT_REFUSED_CONFIG = 3
"""The engine launcher's exit code for a config it refuses (pdmtp_engine.launcher)."""


def refuse(reason: str, env: Mapping[str, str]) -> int:
    """The launcher's refusal: one line in the termination-message file, exit 3."""
    line = f"pdmtp-engine refused to start: {reason}".replace("\n", " ")
    path = env.get("PDMTP_TERMINATION_LOG", "/dev/termination-log")
    with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as out:
        out.write(line + "\n")
    print(line, file=sys.stderr, flush=True)
    return EXIT_REFUSED_CONFIG


def main(argv: list[str]) -> int:
    env = dict(os.environ)
    pod = pod_name(env, env.get("HOSTNAME") or socket.gethostname())
    args = parse_vllm_serve(argv)
    if env.get("PDMTP_EMULATOR_REFUSE"):
        return refuse(env["PDMTP_EMULATOR_REFUSE"], env)
    group = ranks.group_from(args, env)
    if group is not None and not group.leader:
        role_of(args, env)  # a misrendered rank fails as its leader would
        return asyncio.run(ranks.run_rank(group, pod, env))
    engine = engine_from(argv, env, pod)
    dead_exit = ranks.seconds_from(
        env, ranks.ENV_DEAD_EXIT_SECONDS, ranks.DEFAULT_DEAD_EXIT_SECONDS
    )
    return asyncio.run(run(engine, group, dead_exit))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
