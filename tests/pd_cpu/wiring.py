"""The product's own wiring for a 1P+1D PDDeployment, made runnable on one loopback.

The operator renders engine pods for a cluster: each pod has its own IP, listens on the fixed
ports 8000 (HTTP) and 8998 (Mooncake bootstrap), gets VLLM_HOST_IP from the downward API and
runs the engine image's ENTRYPOINT. Here both engines and the router share one loopback in a
loopback-only network namespace, so `on_one_host` makes exactly these substitutions, each checked
against the rendered value it replaces (a change in the rendering fails the tier instead of being
papered over):

- `--host 0.0.0.0` -> `--host 127.0.0.1` (bind loopback only);
- `--port 8000` -> a free port per engine (two engines cannot share one);
- VLLM_HOST_IP (downward API `status.podIP`) -> 127.0.0.1, what the pod IP is on this host;
- VLLM_MOONCAKE_BOOTSTRAP_PORT on the prefill -> a free port (the decode does not bind it: vLLM
  starts the bootstrap server on the producer only), and the router is told that port, as the
  operator tells it the pod's `pdmtp.io/bootstrap-port` annotation.

A multi-node group (spec.<role>.multiNode: one replica as a group of pods, each its own host in a
cluster) gets those per rank, and `group_on_one_host` adds the group's own: the leader's DNS name
(through the role's headless Service) -> 127.0.0.1 wherever it is rendered, and the rendezvous
port (`--data-parallel-rpc-port` or `--master-port`) -> a free one.

Every other argument and env var is used as rendered. The router's arguments come from the
operator's own renderer (`static_router_args`, what it gives the per-revision router) with the
engines' loopback URLs.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from loopback import LOOPBACK

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
ROLE_LABEL: Final = "pdmtp.io/role"
BOOTSTRAP_ANNOTATION: Final = "pdmtp.io/bootstrap-port"
METRICS_PORT_ENV: Final = "PDMTP_METRICS_PORT"
"""pdmtp.api.vocabulary.ENV_METRICS_PORT (this tier's venv has no pdmtp to import it from)."""
ENGINE_ROLES: Final = ("prefill", "decode")
GROUP_LABEL: Final = "pdmtp.io/group"
GROUP_RANK_LABEL: Final = "pdmtp.io/group-rank"
LEADER_ADDRESS_ENV: Final = "PDMTP_LEADER_ADDRESS"
"""pdmtp.api.vocabulary.ENV_LEADER_ADDRESS: the group leader's DNS name, on every rank."""
RENDEZVOUS_FLAGS: Final = {
    "DataParallel": ("--data-parallel-address", "--data-parallel-rpc-port"),
    "TensorParallel": ("--master-addr", "--master-port"),
}
"""Per multiNode layout, the flags naming the leader's address and the group's rendezvous port."""

ENV_OPERATOR_PYTHON: Final = "PDMTP_OPERATOR_PYTHON"
"""The interpreter that runs the operator's CLI (default: the repo's .venv, `make venv`)."""
ENV_OPERATOR_SRC: Final = "PDMTP_OPERATOR_SRC"
"""Where the operator package is imported from (default: the work tree's operator/)."""


class RenderingChanged(AssertionError):
    """The rendered Deployment no longer has a value this harness substitutes."""


def operator_command(*args: str) -> tuple[list[str], dict[str, str]]:
    python = os.environ.get(ENV_OPERATOR_PYTHON, str(REPO_ROOT / ".venv" / "bin" / "python"))
    source = os.environ.get(ENV_OPERATOR_SRC, str(REPO_ROOT / "operator"))
    env = {**os.environ, "PYTHONPATH": source}
    return [python, *args], env


def run_operator_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`pdmtp ARGS...` from the operator's own environment."""
    command, env = operator_command("-m", "pdmtp.cli", *args)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def sample_pddeployment(
    model: Path,
    *,
    num_speculative_tokens: int,
    mtp_modules: int,
    block_size: int,
    max_model_len: int,
    decode_num_speculative_tokens: int | None = None,
    decode_multi_node: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A 1P+1D PDDeployment over Mooncake TCP serving the local checkpoint `model`; with
    `decode_multi_node` (spec.decode.multiNode) the one decode replica is a group of pods."""
    spec: dict[str, Any] = {
        "model": {"name": str(model), "mtpModules": mtp_modules},
        "image": "pdmtp-engine:cpu-test",
        # float32: the CPU platform would downcast `auto` to bfloat16, widening the numeric gap
        # between a P/D pair and one engine that greedy equality has to survive.
        "engine": {
            "dtype": "float32",
            "blockSize": block_size,
            "maxModelLen": max_model_len,
            # Eager mode through the field users pass extra `vllm serve` flags with: it skips
            # ~25 s of CPU graph capture per engine start, which the tier pays seven times.
            "extraArgs": ["--enforce-eager"],
        },
        "speculative": {"method": "mtp", "numSpeculativeTokens": num_speculative_tokens},
        "kvTransfer": {"protocol": "tcp"},
        "prefill": {"replicas": 1, "tensorParallelSize": 1},
        "decode": {"replicas": 1, "tensorParallelSize": 1},
    }
    if decode_num_speculative_tokens is not None:
        spec["decode"]["speculative"] = {"numSpeculativeTokens": decode_num_speculative_tokens}
    if decode_multi_node is not None:
        spec["decode"]["multiNode"] = dict(decode_multi_node)
    return {
        "apiVersion": "pdmtp.io/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": "cpu-pd", "namespace": "default"},
        "spec": spec,
    }


def render(pddeployment: Mapping[str, Any]) -> subprocess.CompletedProcess[str]:
    """`pdmtp render -o json` of the object (the CLI reads YAML, of which JSON is a subset)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as sample:
        json.dump(pddeployment, sample)
        sample.flush()
        return run_operator_cli("render", "-o", "json", sample.name)


@dataclass(frozen=True)
class EngineWiring:
    """One engine pod's container, as rendered, plus the loopback ports it will use."""

    role: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    http_port: int
    bootstrap_port: int | None
    substituted: tuple[str, ...] = field(default=())
    """What on_one_host changed, for the test log."""

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}"

    def flag(self, name: str) -> str:
        index = self.args.index(name)
        return self.args[index + 1]

    def with_flag(self, name: str, value: str) -> EngineWiring:
        """A copy with one flag's value replaced (for the discrimination runs)."""
        args = list(self.args)
        index = args.index(name)
        args[index + 1] = value
        return replace(self, args=tuple(args))


def rendered_engines(
    render_output: str, roles: tuple[str, ...] = ENGINE_ROLES
) -> dict[str, dict[str, Any]]:
    """The engine container and pod annotations of each role's Deployment, by role (`roles`:
    the roles rendered as Deployments, one pod per replica)."""
    items = json.loads(render_output)["items"]
    found: dict[str, dict[str, Any]] = {}
    for item in items:
        role = item["metadata"].get("labels", {}).get(ROLE_LABEL)
        if item["kind"] == "Deployment" and role in roles:
            template = item["spec"]["template"]
            (container,) = [c for c in template["spec"]["containers"] if c["name"] == "engine"]
            found[role] = {
                "container": container,
                "annotations": template["metadata"].get("annotations", {}),
                "replicas": item["spec"]["replicas"],
            }
    if sorted(found) != sorted(roles):
        raise RenderingChanged(f"expected Deployments for {sorted(roles)}, got {sorted(found)}")
    return found


def rendered_group(render_output: str, role: str, group: str) -> list[dict[str, Any]]:
    """The pods of one multi-node group of `role`, by rank: each pod's manifest, its engine
    container and annotations, and its DNS name (hostname.subdomain.namespace.svc)."""
    pods: dict[int, dict[str, Any]] = {}
    for item in json.loads(render_output)["items"]:
        labels = item["metadata"].get("labels", {})
        if item["kind"] != "Pod" or labels.get(ROLE_LABEL) != role:
            continue
        if labels.get(GROUP_LABEL) != group:
            continue
        spec = item["spec"]
        (container,) = [c for c in spec["containers"] if c["name"] == "engine"]
        pods[int(labels[GROUP_RANK_LABEL])] = {
            "manifest": item,
            "container": container,
            "annotations": item["metadata"].get("annotations", {}),
            "dns": f"{spec['hostname']}.{spec['subdomain']}.{item['metadata']['namespace']}.svc",
        }
    if sorted(pods) != list(range(len(pods))) or len(pods) < 2:
        raise RenderingChanged(f"{role} group {group}: pods of ranks {sorted(pods)}")
    return [pods[rank] for rank in sorted(pods)]


def _replace_flag(args: list[str], name: str, rendered: str, value: str) -> None:
    index = args.index(name) if name in args else -1
    if index < 0 or args[index + 1] != rendered:
        raise RenderingChanged(f"rendered args lack `{name} {rendered}`: {args}")
    args[index + 1] = value


def on_one_host(
    role: str, rendered: Mapping[str, Any], http_port: int, bootstrap_port: int
) -> EngineWiring:
    """The rendered engine of `role`, with the substitutions listed in this module's docstring."""
    container = rendered["container"]
    args = list(container["args"])
    _replace_flag(args, "--host", "0.0.0.0", LOOPBACK)
    rendered_port = str(container["ports"][0]["containerPort"])
    _replace_flag(args, "--port", rendered_port, str(http_port))
    substituted = [f"--host 0.0.0.0 -> {LOOPBACK}", f"--port {rendered_port} -> {http_port}"]

    env: dict[str, str] = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[var["name"]] = LOOPBACK
            substituted.append(f"{var['name']} (status.podIP) -> {LOOPBACK}")
        else:
            raise RenderingChanged(f"env {var['name']} comes from {var.get('valueFrom')}")
    if env.get("VLLM_HOST_IP") != LOOPBACK:
        raise RenderingChanged("VLLM_HOST_IP is not taken from the pod IP")
    # Both engines share one host here, so their metrics-only listeners would share a port: the
    # listener is left out (the engine and images tiers test it), the engine itself is not.
    if env.pop(METRICS_PORT_ENV, None) is not None:
        substituted.append(f"{METRICS_PORT_ENV} dropped (one host: no metrics-only listener)")

    used_bootstrap: int | None = None
    if role == "prefill":
        rendered_bootstrap = rendered["annotations"].get(BOOTSTRAP_ANNOTATION)
        if env.get("VLLM_MOONCAKE_BOOTSTRAP_PORT") != rendered_bootstrap:
            raise RenderingChanged(
                f"prefill bootstrap port: env {env.get('VLLM_MOONCAKE_BOOTSTRAP_PORT')} vs "
                f"annotation {rendered_bootstrap}"
            )
        env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(bootstrap_port)
        used_bootstrap = bootstrap_port
        substituted.append(f"VLLM_MOONCAKE_BOOTSTRAP_PORT {rendered_bootstrap} -> {bootstrap_port}")
    return EngineWiring(
        role=role,
        args=tuple(args),
        env=env,
        http_port=http_port,
        bootstrap_port=used_bootstrap,
        substituted=tuple(substituted),
    )


def group_on_one_host(
    role: str, pods: list[dict[str, Any]], http_ports: list[int], rendezvous_port: int
) -> list[EngineWiring]:
    """The ranks of one rendered multi-node group, by rank, each with on_one_host's substitutions
    and the group's own: the leader's DNS name (rank 0's hostname.subdomain.namespace.svc, in
    the rendezvous address flag and PDMTP_LEADER_ADDRESS of every rank) -> 127.0.0.1, and the
    rendezvous port (`--data-parallel-rpc-port` or `--master-port`) -> `rendezvous_port`."""
    leader = pods[0]["dns"]
    ranks: list[EngineWiring] = []
    for rank, (pod, http_port) in enumerate(zip(pods, http_ports, strict=True)):
        one = on_one_host(role, pod, http_port, 0)
        args = list(one.args)
        layouts = [name for name, (flag, _) in RENDEZVOUS_FLAGS.items() if flag in args]
        if len(layouts) != 1:
            raise RenderingChanged(f"rank {rank}: no single multi-node layout in {args}")
        address_flag, port_flag = RENDEZVOUS_FLAGS[layouts[0]]
        _replace_flag(args, address_flag, leader, LOOPBACK)
        rendered_port = args[args.index(port_flag) + 1]
        _replace_flag(args, port_flag, rendered_port, str(rendezvous_port))
        env = dict(one.env)
        if env.get(LEADER_ADDRESS_ENV) != leader:
            raise RenderingChanged(f"rank {rank}: {LEADER_ADDRESS_ENV} is not {leader}")
        env[LEADER_ADDRESS_ENV] = LOOPBACK
        substituted = [
            *one.substituted,
            f"{address_flag} and {LEADER_ADDRESS_ENV} {leader} -> {LOOPBACK}",
            f"{port_flag} {rendered_port} -> {rendezvous_port}",
        ]
        ranks.append(replace(one, args=tuple(args), env=env, substituted=tuple(substituted)))
    return ranks


def ranks_the_router_lists(pods: list[dict[str, Any]]) -> list[int]:
    """The ranks of a rendered group that the operator's router lists once every rank is Ready:
    the operator's own code (`grouping.units`, which folds a group into one replica, then
    `observe.revision_membership`, which picks the router's engines) over the rendered pods,
    each given a Running, Ready status and a pod IP of its own from TEST-NET-1 (192.0.2.0/24:
    only compared here, never dialed)."""
    fake_ip = {f"192.0.2.{rank + 1}": rank for rank in range(len(pods))}
    observed = []
    for ip, rank in fake_ip.items():
        pod = json.loads(json.dumps(pods[rank]["manifest"]))
        pod["status"] = {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        observed.append(pod)
    program = """
import json, sys
from pdmtp.core.groups.grouping import units
from pdmtp.core.render.membership import revision_membership
a = json.loads(sys.argv[1])
membership = revision_membership(
    units(a["pods"], []), deployment_name=a["name"], revision=a["revision"])
print(json.dumps(list(membership.decodes)))
"""
    labels = observed[0]["metadata"]["labels"]
    request = {
        "pods": observed,
        "name": labels["pdmtp.io/name"],
        "revision": labels["pdmtp.io/revision"],
    }
    command, env = operator_command("-c", program, json.dumps(request))
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    if completed.returncode != 0:
        raise RuntimeError(f"the operator's membership failed: {completed.stderr[-3000:]}")
    urls = json.loads(completed.stdout)
    return [fake_ip[url.removeprefix("http://").rsplit(":", 1)[0]] for url in urls]


@dataclass(frozen=True)
class RouterWiring:
    binary: Path
    args: list[str]


def router_wiring(
    prefill: EngineWiring, decode: EngineWiring, *, port: int, metrics_port: int
) -> RouterWiring:
    """The per-revision router: the operator's renderer (`static_router_args`, what the operator
    gives the router once both engines are Ready) over the engines' loopback URLs, and the
    vllm-router executable installed beside the operator, checked against the version it pins."""
    assert prefill.bootstrap_port is not None
    program = """
import json, sys, sysconfig
from importlib.metadata import version
from pathlib import Path
from pdmtp.api.vocabulary import ROUTER_VERSION
from pdmtp.core.render.router import static_router_args
a = json.loads(sys.argv[1])
print(json.dumps({
    "args": static_router_args(
        prefills=[(a["prefill"], a["bootstrap"])], decodes=[a["decode"]], policy="round_robin",
        host=a["host"], port=a["port"], metrics_host=a["host"], metrics_port=a["metrics_port"]),
    "binary": str(Path(sysconfig.get_path("scripts")) / "vllm-router"),
    "installed": version("vllm-router"),
    "pinned": ROUTER_VERSION,
}))
"""
    request = {
        "prefill": prefill.url,
        "bootstrap": prefill.bootstrap_port,
        "decode": decode.url,
        "host": LOOPBACK,
        "port": port,
        "metrics_port": metrics_port,
    }
    command, env = operator_command("-c", program, json.dumps(request))
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    if completed.returncode != 0:
        raise RuntimeError(f"the operator's router renderer failed: {completed.stderr[-3000:]}")
    answer = json.loads(completed.stdout)
    if answer["installed"] != answer["pinned"]:
        raise RuntimeError(
            f"vllm-router {answer['installed']} is installed; the operator pins {answer['pinned']}"
        )
    return RouterWiring(binary=Path(answer["binary"]), args=list(answer["args"]))
