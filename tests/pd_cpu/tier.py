"""The tier's fixed choices and the product wiring for its pairs (used by conftest and tests)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from fleet import Launch
from loopback import LOOPBACK, free_ports
from processes import launcher_command
from wiring import (
    EngineWiring,
    group_on_one_host,
    on_one_host,
    ranks_the_router_lists,
    render,
    rendered_engines,
    rendered_group,
    sample_pddeployment,
)

BLOCK_SIZE = 128
"""vLLM's CPU default, and the PDDeployment's spec.engine.blockSize."""
MTP_MODULES = 3
MAX_MODEL_LEN = 2048
MAX_TOKENS = 32
# Lengths straddling the first two block boundaries. With backoff 2 (k=3) the prefill computes
# 126, 128, 254 and 256 tokens for 128, 130, 256 and 258: truncated prompts ending exactly on a
# block boundary (the vllm-ascend #8908 case) and prompts that are whole blocks themselves. For
# 131 the prefill computes a block more than the decode pulls (129 and 126 tokens at k=3, 130 and
# 128 at k=2): it must ship only the first.
PROMPT_LENGTHS = (127, 128, 129, 130, 131, 255, 256, 257, 258)
PROMPT_SEED = 8908
TIER_DISTANCES = (2, 40)
"""The tier's checkpoint (lookback_mimo.py) computes each next token from the current one and
those 2 and 40 back, and so does its drafter. 2 is the backoff at k=3 and the backoff + 1 at
k=2: the drafter's KV entry at the prefill's last computed position is read by the first
drafts of the first round after the hand-off. 40 makes the answers depend on pulled KV well
before the prompt's end (a block shifted in transfer changes them)."""


def render_pair(
    model: Path, num_speculative_tokens: int, *, decode_num_speculative_tokens: int | None = None
) -> dict[str, EngineWiring]:
    """`pdmtp render` of the tier's PDDeployment, each engine on its own loopback ports."""
    rendered = render(
        sample_pddeployment(
            model,
            num_speculative_tokens=num_speculative_tokens,
            mtp_modules=MTP_MODULES,
            block_size=BLOCK_SIZE,
            max_model_len=MAX_MODEL_LEN,
            decode_num_speculative_tokens=decode_num_speculative_tokens,
        )
    )
    assert rendered.returncode == 0, rendered.stderr
    engines = rendered_engines(rendered.stdout)
    prefill_port, bootstrap_port, decode_port = free_ports(3)
    return {
        "prefill": on_one_host("prefill", engines["prefill"], prefill_port, bootstrap_port),
        "decode": on_one_host("decode", engines["decode"], decode_port, 0),
    }


DECODE_GROUP_RANKS: Final = 2
DECODE_GROUP: Final = {
    "nodes": DECODE_GROUP_RANKS,
    "layout": "DataParallel",
    "dataParallelSize": DECODE_GROUP_RANKS,
}
"""spec.decode.multiNode of the two-rank decode: one replica as 2 pods of one data-parallel rank
each (tensorParallelSize 1), the smallest multi-node shape, and one a 2-core machine can run."""


@dataclass(frozen=True)
class GroupRender:
    """`pdmtp render` of the tier's PDDeployment with a multi-node decode, on loopback."""

    prefill: EngineWiring
    """The prefill Deployment's engine, with the ports the 1P+1D render of the same k got."""
    decode: list[EngineWiring]
    """The decode group's ranks, leader first."""
    routed: list[int]
    """The ranks the operator's router lists (wiring.ranks_the_router_lists)."""


def render_decode_group(model: Path, k: int, prefill_like: EngineWiring) -> GroupRender:
    """`pdmtp render` with spec.decode.multiNode = DECODE_GROUP: its prefill on the ports of
    `prefill_like` (the 1P+1D render's, so an equal engine compares equal), its decode group's
    ranks each on its own HTTP port, with one rendezvous port."""
    spec = sample_pddeployment(
        model,
        num_speculative_tokens=k,
        mtp_modules=MTP_MODULES,
        block_size=BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        decode_multi_node=DECODE_GROUP,
    )
    rendered = render(spec)
    assert rendered.returncode == 0, rendered.stderr
    (prefill,) = rendered_engines(rendered.stdout, roles=("prefill",)).values()
    assert prefill_like.bootstrap_port is not None
    pods = rendered_group(rendered.stdout, "decode", "g0")
    *http_ports, rendezvous_port = free_ports(len(pods) + 1)
    return GroupRender(
        prefill=on_one_host(
            "prefill", prefill, prefill_like.http_port, prefill_like.bootstrap_port
        ),
        decode=group_on_one_host("decode", pods, http_ports, rendezvous_port),
        routed=ranks_the_router_lists(pods),
    )


def reference_launch(prefill: EngineWiring) -> Launch:
    """One engine with the same engine settings and no P/D: the rendered prefill's `vllm serve`
    args without the KV connector, and without speculation, so its greedy output is the plain
    target model's, which MTP and the P/D split must both leave unchanged. Started with `vllm
    serve` directly: the launcher refuses a pod with no Backoff connector, rightly."""
    args = list(prefill.args)
    for flag in ("--kv-transfer-config", "--speculative-config"):
        index = args.index(flag)
        del args[index : index + 2]
    (port,) = free_ports(1)
    args[args.index("--port") + 1] = str(port)
    return Launch(
        host_env=pinned(0),
        name="reference",
        command=tuple(args),
        pod_env={"VLLM_HOST_IP": LOOPBACK},
        url=f"http://{LOOPBACK}:{port}",
    )


def fixed_launches(k: int, wiring: dict[str, EngineWiring]) -> list[Launch]:
    """Both engines exactly as the image starts them: the launcher, the rendered args and env."""
    return [
        launch(f"{role}-k{k}", wiring[role], via_launcher=True) for role in ("prefill", "decode")
    ]


CORE_OF_ROLE = {"prefill": 0, "decode": 1}
"""vLLM's CPU worker pins its OpenMP threads to cores; left to itself ("auto") every engine on
this two-core machine takes core 0 and keeps core 1 spare, and a P/D pair then starves its own
Mooncake threads (requests took minutes). Each role gets a core of its own, as each pod gets its
own GPU."""


CORE_OF_DECODE_RANK: Final = (1, 1)
"""The two-rank decode: both ranks on the decode's core, the prefill alone on its own. Not one
rank on the prefill's core: a prefill holding KV for a decode polls its worker in a busy loop
(vLLM's shm_broadcast spins on sched_yield), and a decode rank sharing that core got ~6% of it
and took minutes to send its first pull (seen 2026-12-03). With one request in flight only one
decode rank works at a time."""


def pinned(core: int) -> dict[str, str]:
    return {"VLLM_CPU_OMP_THREADS_BIND": str(core)}


def launch(name: str, wiring: EngineWiring, *, via_launcher: bool) -> Launch:
    command = launcher_command(wiring.args) if via_launcher else list(wiring.args)
    return Launch(
        name=name,
        command=tuple(command),
        pod_env=wiring.env,
        url=wiring.url,
        host_env=pinned(CORE_OF_ROLE[wiring.role]),
    )


def stock_wiring(wiring: EngineWiring) -> EngineWiring:
    """The rendered engine with vLLM's own `MooncakeConnector` in place of the project's, on
    ports of its own (the fixed engine of the same role may still be running).

    Such an engine is started with `vllm serve` directly: the launcher refuses that connector,
    which is its job; this is the engine it prevents, run to show what the fixed one changes.
    """
    config = json.loads(wiring.flag("--kv-transfer-config"))
    assert config.pop("kv_connector_module_path") == "pdmtp_engine.connector"
    assert config["kv_connector"] == "BackoffMooncakeConnector"
    config["kv_connector"] = "MooncakeConnector"
    http_port, bootstrap_port = free_ports(2)
    stock = wiring.with_flag("--kv-transfer-config", json.dumps(config))
    stock = stock.with_flag("--port", str(http_port))
    env = dict(stock.env)
    if stock.bootstrap_port is not None:
        env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(bootstrap_port)
    return replace(
        stock,
        env=env,
        http_port=http_port,
        bootstrap_port=None if stock.bootstrap_port is None else bootstrap_port,
    )
