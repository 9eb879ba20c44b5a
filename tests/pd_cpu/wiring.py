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
) -> dict[str, Any]:
    """A 1P+1D PDDeployment over Mooncake TCP serving the local checkpoint `model`."""
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


def rendered_engines(render_output: str) -> dict[str, dict[str, Any]]:
    """The engine container and pod annotations of each role's Deployment, by role."""
    items = json.loads(render_output)["items"]
    found: dict[str, dict[str, Any]] = {}
    for item in items:
        role = item["metadata"].get("labels", {}).get(ROLE_LABEL)
        if item["kind"] == "Deployment" and role in ENGINE_ROLES:
            template = item["spec"]["template"]
            (container,) = [c for c in template["spec"]["containers"] if c["name"] == "engine"]
            found[role] = {
                "container": container,
                "annotations": template["metadata"].get("annotations", {}),
                "replicas": item["spec"]["replicas"],
            }
    if sorted(found) != sorted(ENGINE_ROLES):
        raise RenderingChanged(f"expected a prefill and a decode Deployment, got {sorted(found)}")
    return found


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
from pdmtp.core.router import static_router_args
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
