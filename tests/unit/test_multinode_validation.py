"""Multi-node shapes (spec.<role>.multiNode) that vLLM 0.33 would refuse at start-up are refused
offline, by `pdmtp validate`, in the words of the CRD's CEL rule; shapes that work are accepted,
and what the operator renders for them passes vLLM's own checks.

The table is cluster/pod_corpus.py's MULTI_NODE (docs/validation-corpus.md, "Multi-node
shapes"), which tests/cluster/test_validation_corpus.py proves on the real API server. `refusal`
below mirrors vLLM 0.33's argument checks of data parallel and multi-node launches
(vllm/engine/arg_utils.py `EngineArgs.create_engine_config`, vllm/config/parallel.py
`ParallelConfig`, vllm/entrypoints/cli/serve.py), read from the pinned wheel, so the property
tests can say: every spec `pdmtp validate` accepts renders ranks vLLM accepts, and every shape
whose ranks vLLM would refuse, `pdmtp validate` refuses.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import compat_revision, pdd
from cluster.pod_corpus import MULTI_NODE, Shape, doc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pdmtp.api import vocabulary as v
from pdmtp.api.crd import crd
from pdmtp.api.flags import OWNED_FLAGS, owned_flag
from pdmtp.api.multinode import GROUP_ARGS, MultiNodeSpec
from pdmtp.api.rules import CEL_KEY
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.cli import main
from pdmtp.core.agreement import check
from pdmtp.core.groups.podgroups import rank_args
from pdmtp.core.render.children import RevisionReplicas, revision_children
from pdmtp.core.validation import validate
from pydantic import ValidationError

REPO = Path(__file__).resolve().parents[2]
SAMPLES = sorted((REPO / "samples").glob("*.yaml"))
Doc = dict[str, Any]


def run_validate(
    body: Doc | bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    path = tmp_path / "pdd.yaml"
    if isinstance(body, bytes):
        path.write_bytes(body)
    else:
        path.write_text(yaml.safe_dump(body, sort_keys=False))
    code = main(["validate", str(path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out


def cel_messages(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for rule in node.get(CEL_KEY, []):
            yield rule["message"]
        for value in node.values():
            yield from cel_messages(value)
    elif isinstance(node, list):
        for value in node:
            yield from cel_messages(value)


CEL_MESSAGES = list(cel_messages(crd()))

# ---- the table ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", MULTI_NODE, ids=[s.name for s in MULTI_NODE])
def test_validate_gives_each_row_its_verdict_and_words(
    shape: Shape, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run_validate(doc(shape), tmp_path, capsys)
    assert code == shape.exit_code, out
    if shape.layer == "accepted":
        assert ": compatible" in out, out
        return
    assert shape.words in out, out
    assert len([line for line in out.splitlines() if not line.startswith("  ")]) == 1, out


@pytest.mark.parametrize(
    "shape", [s for s in MULTI_NODE if s.layer in ("CEL", "owned")], ids=lambda s: s.name
)
def test_the_crd_refuses_in_the_same_words(shape: Shape) -> None:
    """The words are a CEL rule's message: what `kubectl apply` prints (proved on the API
    server by tests/cluster/test_validation_corpus.py)."""
    assert any(shape.words in message for message in CEL_MESSAGES), shape.words


@pytest.mark.parametrize(
    "shape", [s for s in MULTI_NODE if s.layer in ("schema", "CEL")], ids=lambda s: s.name
)
def test_pydantic_refuses_the_impossible_shapes(shape: Shape) -> None:
    with pytest.raises(ValidationError) as refused:
        PDDeployment.model_validate(doc(shape))
    assert shape.words in str(refused.value)


def test_the_table_holds_the_good_shapes_and_every_group_of_flags() -> None:
    accepted = " ".join(s.name for s in MULTI_NODE if s.layer == "accepted")
    for needle in ("DataParallel 16 with expert parallel", "TensorParallel 16 GPUs", "4 nodes"):
        assert needle in accepted, needle
    words = " ".join(s.words for s in MULTI_NODE)
    for group in GROUP_ARGS:
        assert group.flags[0] in words, group.flags


# ---- single-node specs are as valid as before --------------------------------------------------


def _single_node(sample: Path) -> bool:
    body = yaml.safe_load(sample.read_text())
    return all("multiNode" not in (body["spec"].get(r) or {}) for r in v.ENGINE_ROLES)


SINGLE_NODE_SAMPLES = [s for s in SAMPLES if _single_node(s)]


def test_the_samples_before_multi_node_are_single_node() -> None:
    assert {s.name for s in SINGLE_NODE_SAMPLES} >= {
        "demo.yaml",
        "full.yaml",
        "minimal.yaml",
        "production.yaml",
    }


@pytest.mark.parametrize("sample", SINGLE_NODE_SAMPLES, ids=[s.name for s in SINGLE_NODE_SAMPLES])
def test_a_single_node_sample_stays_valid(
    sample: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run_validate(sample.read_bytes(), tmp_path, capsys)
    assert code == 0 and ": compatible" in out, out


@pytest.mark.parametrize(
    "args",
    [
        ["--data-parallel-size", "2"],
        ["-dp", "2", "--enable-expert-parallel"],
        ["-ep"],
        ["--enable-eplb", "--enable-expert-parallel"],
        ["--api-server-count", "2"],
        ["--data-parallel-backend", "mp"],
        ["-pcp", "1"],
    ],
)
@pytest.mark.parametrize("where", ["engine", "decode"])
def test_single_node_specs_keep_their_parallel_flags(args: list[str], where: str) -> None:
    """Only a role WITH multiNode leaves these to the operator; one pod may still use them."""
    b = pdd("x")
    if where == "engine":
        b.engine(extraArgs=args)
    else:
        b.decode(extra_args=args)
    verdict = validate(b.dict())
    assert verdict.compatible, verdict.message()


# ---- the wiring flags are owned ----------------------------------------------------------------

WIRING = [
    "--nnodes",
    "-n",
    "--node-rank",
    "-r",
    "--master-addr",
    "--master-port",
    "--headless",
    "--data-parallel-address",
    "-dpa",
    "--data-parallel-rpc-port",
    "-dpp",
    "--data-parallel-start-rank",
    "-dpr",
    "--data-parallel-rank",
    "-dpn",
    "--data-parallel-size-local",
    "-dpl",
]


@pytest.mark.parametrize("flag", WIRING)
def test_the_wiring_flags_are_owned_in_every_spec(flag: str) -> None:
    assert OWNED_FLAGS[flag].startswith("spec.<role>.multiNode")
    assert owned_flag(flag) == flag and owned_flag(f"{flag}=1") == flag
    verdict = validate(pdd("x").prefill(extra_args=[flag, "1"]).dict())
    assert (
        not verdict.compatible and "must not set flags owned by typed fields" in verdict.message()
    )
    assert f"{flag} (set by spec.<role>.multiNode" in verdict.message()


@pytest.mark.parametrize(
    ("arg", "flag"),
    [
        ("-n2", "-n"),
        ("-r1", "-r"),
        ("-qfp8", "-q"),
        ("--node_rank=1", "--node-rank"),
        ("--data_parallel_start_rank", "--data-parallel-start-rank"),
        ("-tp4", None),  # argparse refuses it: only one-letter short forms take a value attached
        ("-dp", None),
        ("--data-parallel-size", None),
        ("--enable-expert-parallel", None),
        ("-n\n", None),  # CEL's matches does not take it either
        ("--nnodes-x", None),
    ],
)
def test_short_forms_with_attached_values(arg: str, flag: str | None) -> None:
    assert owned_flag(arg) == flag


# ---- what vLLM 0.33 itself checks --------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    """The `vllm serve` options the checks read, spelt as vLLM 0.33 declares them."""
    p = argparse.ArgumentParser(add_help=False)
    bool_ = {"action": argparse.BooleanOptionalAction, "default": False}
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--prefill-context-parallel-size", "-pcp", type=int, default=1)
    p.add_argument("--master-addr")
    p.add_argument("--master-port", type=int)
    p.add_argument("--nnodes", "-n", type=int, default=1)
    p.add_argument("--node-rank", "-r", type=int, default=0)
    p.add_argument("--distributed-executor-backend")
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--data-parallel-rank", "-dpn", type=int)
    p.add_argument("--data-parallel-start-rank", "-dpr", type=int)
    p.add_argument("--data-parallel-size-local", "-dpl", type=int)
    p.add_argument("--data-parallel-address", "-dpa")
    p.add_argument("--data-parallel-rpc-port", "-dpp", type=int)
    p.add_argument("--data-parallel-backend", "-dpb", default="mp")
    p.add_argument("--data-parallel-hybrid-lb", "-dph", **bool_)
    p.add_argument("--data-parallel-external-lb", "-dpe", **bool_)
    p.add_argument("--data-parallel-multi-port-external-lb", "-dpm", action="store_true")
    p.add_argument("--enable-expert-parallel", "-ep", **bool_)
    p.add_argument("--enable-eplb", **bool_)
    p.add_argument("--enable-elastic-ep", **bool_)
    p.add_argument("--enable-fault-tolerance", **bool_)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--api-server-count", "-asc", type=int)
    return p


PARSER = _parser()


def refusal(argv: list[str]) -> tuple[str | None, int]:
    """(vLLM's refusal of `vllm serve <argv>`, or None; the GPUs the process needs). Internal
    load balancing only: pdmtp never asks for external LB (vLLM refuses it for dense models)."""
    a, _ = PARSER.parse_known_args(argv[3:])  # vllm serve MODEL
    # entrypoints/cli/serve.py
    if a.headless and a.api_server_count is not None and a.api_server_count > 0:
        return "--api-server-count cannot be used with --headless", 0
    external = a.data_parallel_external_lb or a.data_parallel_rank is not None
    if not a.data_parallel_hybrid_lb and not a.data_parallel_multi_port_external_lb:
        hybrid = a.data_parallel_start_rank is not None
    else:
        hybrid = a.data_parallel_hybrid_lb
    if external + hybrid + a.data_parallel_multi_port_external_lb > 1:
        return "more than one data parallel load balancing mode", 0
    # engine/arg_utils.py create_engine_config
    if a.headless and a.data_parallel_hybrid_lb:
        return "data_parallel_hybrid_lb is not applicable in headless mode", 0
    if a.data_parallel_hybrid_lb and a.data_parallel_external_lb:
        return "hybrid and external LB together", 0
    if a.nnodes > 1 and a.data_parallel_backend != "mp":
        return "--nnodes > 1 requires --data-parallel-backend mp", 0
    within_dp = a.pipeline_parallel_size * a.tensor_parallel_size * a.prefill_context_parallel_size
    dp, local, rank = a.data_parallel_size, a.data_parallel_size_local, 0
    if a.nnodes > 1:
        world = dp * within_dp
        if world % a.nnodes:
            return "--nnodes must evenly divide the total world size", 0
        if not 0 <= a.node_rank < a.nnodes:
            return "--node-rank must be between 0 and nnodes - 1", 0
        rank = a.node_rank * (world // a.nnodes) // within_dp
        if local is None:
            local = max(world // a.nnodes // within_dp, 1)
    if a.enable_fault_tolerance and not external:
        return "fault tolerance requires external load balancer mode", 0
    if external:
        return "external data parallel mode (refused for dense models)", 0
    if local is not None:
        hybrid = a.data_parallel_hybrid_lb or (
            a.data_parallel_start_rank is not None and not a.headless
        )
        if hybrid and local == 1:
            return "hybrid LB with one local rank switches to external LB", 0
        rank = a.data_parallel_start_rank if a.data_parallel_start_rank is not None else rank
    else:
        local = dp
    # config/parallel.py ParallelConfig
    if local > dp:
        return "data_parallel_size_local must be <= data_parallel_size", 0
    if a.enable_eplb and not a.enable_expert_parallel:
        return "enable_expert_parallel must be True to use EPLB", 0
    if a.enable_eplb and a.tensor_parallel_size * a.prefill_context_parallel_size * dp <= 1:
        return "EPLB requires tensor, prefill-context, or data parallelism", 0
    if a.enable_elastic_ep and (not a.enable_eplb or a.pipeline_parallel_size > 1 or hybrid):
        return "elastic EP needs EPLB, no pipeline parallelism, no hybrid LB", 0
    if dp > 1 and not 0 <= rank < dp:
        return "data_parallel_rank out of range", 0
    backend = a.distributed_executor_backend
    if a.nnodes > 1 and backend not in (None, "mp", "uni", "external_launcher"):
        return "nnodes > 1 only with executor backend mp, uni or external_launcher", 0
    nodes_within_dp = 1
    if a.nnodes > 1:
        node_groups = dp // local
        if a.nnodes % node_groups:
            return "nnodes must be divisible by the data parallel node groups", 0
        nodes_within_dp = a.nnodes // node_groups
    # entrypoints/cli/serve.py run_headless
    if a.headless and local <= 0:
        return "data_parallel_size_local must be > 0 in headless mode", 0
    return None, local * within_dp // nodes_within_dp


def group_pods(body: Doc) -> list[Doc]:
    pdd_ = PDDeployment.model_validate(body)
    revision = compat_revision(pdd_.spec)
    children = revision_children(pdd_, revision, RevisionReplicas(1, 1, 1), check(pdd_.spec), None)
    return [c for c in children if c["kind"] == "Pod"]


def assert_vllm_starts(body: Doc) -> None:
    """Every rank of every group passes vLLM's checks, with the GPUs it needs, and a
    DataParallel group's ranks are 0..size-1, each once."""
    pods = group_pods(body)
    assert pods
    ranks: dict[str, list[int]] = {}
    for pod in pods:
        container = pod["spec"]["containers"][0]
        argv = list(container["args"])
        problem, gpus = refusal(argv)
        assert problem is None, (problem, argv)
        assert container["resources"]["limits"][v.GPU_RESOURCE] == gpus, argv
        a, _ = PARSER.parse_known_args(argv[3:])
        if a.data_parallel_size > 1:
            start = a.data_parallel_start_rank or 0
            role = pod["metadata"]["labels"][v.LABEL_ROLE]
            ranks.setdefault(role, []).extend(range(start, start + a.data_parallel_size_local))
    for role, seen in ranks.items():
        assert sorted(seen) == list(range(len(seen))), (role, seen)


@pytest.mark.parametrize(
    "shape", [s for s in MULTI_NODE if s.layer == "accepted"], ids=lambda s: s.name
)
def test_the_good_shapes_render_ranks_vllm_starts(shape: Shape) -> None:
    body = doc(shape)
    body["metadata"].update(namespace="default", uid="u-1")
    assert_vllm_starts(body)


def test_the_mirror_refuses_what_vllm_refuses() -> None:
    """`refusal` itself, on launches vLLM 0.33 refuses (its own words, arg_utils/parallel)."""
    base = ["vllm", "serve", "m"]
    assert refusal([*base, "-tp", "4", "--nnodes", "3"])[0] is not None
    assert refusal([*base, "-tp", "4", "-n", "2", "-r", "2"])[0] is not None
    assert refusal([*base, "-tp", "4", "-n", "2", "-dpb", "ray"])[0] is not None
    assert refusal([*base, "-dp", "2", "-dpl", "4"])[0] is not None
    assert refusal([*base, "-dp", "2", "--enable-eplb"])[0] is not None
    assert refusal([*base, "--enable-eplb", "-ep"])[0] is not None  # TP x DP of 1
    assert refusal([*base, "-dp", "4", "-dpl", "2", "--headless", "-asc", "1"])[0] is not None
    assert refusal([*base, "-dp", "4", "-dpl", "2", "--headless", "-dph"])[0] is not None
    assert refusal([*base, "-dp", "4", "-dpl", "2", "--enable-fault-tolerance"])[0] is not None
    assert refusal([*base, "-tp", "2", "-n", "2", "--distributed-executor-backend", "ray"])[0]
    assert refusal([*base, "-dp", "2", "-dpl", "1", "-dpr", "1"])[0] is not None  # hybrid -> ext
    assert refusal([*base, "-tp", "8", "-n", "2", "-r", "1", "--headless"]) == (None, 4)
    assert refusal([*base, "-dp", "4", "-dpl", "2", "-dpr", "2", "--headless"]) == (None, 2)


# ---- every shape, generated --------------------------------------------------------------------

ROLE_ARGS: list[list[str]] = [
    [],
    ["--max-num-seqs=8"],
    ["--data-parallel-size", "4"],
    ["-ep"],
    ["--no-enable-expert-parallel"],
    ["-pcp", "2"],
    ["--distributed-executor-backend", "ray"],
    ["--data-parallel-backend=ray"],
    ["--data-parallel-hybrid-lb"],
    ["-dpe"],
    ["--enable-fault-tolerance"],
    ["--api-server-count", "1"],
    ["--enable-eplb"],
    ["--enable-elastic-ep", "--enable-eplb"],
    ["--headless"],
    ["-n2"],
    ["--node-rank", "1"],
    ["--data-parallel-rank", "0"],
    ["--data-parallel-start-rank", "1"],
    ["-dpl", "1"],
]


@st.composite
def multi_node_specs(draw: st.DrawFn) -> Doc:
    shape: Doc = {
        "nodes": draw(st.sampled_from([2, 3, 4, 8])),
        "layout": draw(st.sampled_from(["DataParallel", "TensorParallel"])),
    }
    # Mostly the size the layout wants, sometimes the wrong one.
    if (shape["layout"] == "DataParallel") != (draw(st.integers(0, 7)) == 0):
        shape["dataParallelSize"] = draw(st.sampled_from([2, 3, 4, 6, 8, 16, 32]))
    if draw(st.booleans()):
        shape["expertParallel"] = True
    role = draw(st.sampled_from(["prefill", "decode"]))
    b = pdd("x").mtp(1, modules=1)
    tp = draw(st.sampled_from([1, 2, 4, 8, 16]))
    b.prefill(tp=tp).decode(tp=tp)
    getattr(b, role)(
        multiNode=shape,
        pipelineParallelSize=draw(st.sampled_from([1, 2, 3, 4])),
        extra_args=draw(st.sampled_from(ROLE_ARGS)) if draw(st.booleans()) else [],
    )
    engine = draw(st.sampled_from(ROLE_ARGS[:4] + ROLE_ARGS[12:14]))
    if engine and draw(st.booleans()):
        b.engine(extraArgs=engine)
    body = b.dict()
    body["metadata"].update(namespace="default", uid="u-1")
    return body


def naive_argv(body: Doc, role: str, rank: int) -> list[str] | None:
    """What rank `rank` would run if the operator rendered the role whatever the spec: its
    typed sizes, its rank flags, then spec.engine's and the role's extraArgs. None where the
    shape is not one (pydantic refuses the MultiNodeSpec itself)."""
    spec = body["spec"][role]
    try:
        shape = MultiNodeSpec.model_validate(spec["multiNode"])
    except ValidationError:
        return None
    tp, pp = spec.get("tensorParallelSize", 1), spec.get("pipelineParallelSize", 1)
    sizes = ["--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp)]
    extra = [*body["spec"].get("engine", {}).get("extraArgs", []), *spec.get("extraArgs", [])]
    return ["vllm", "serve", "m", *sizes, *rank_args(shape, rank, "leader"), *extra]


@settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(multi_node_specs())
def test_validate_refuses_every_shape_vllm_refuses_and_renders_what_it_starts(body: Doc) -> None:
    verdict = validate(copy.deepcopy(body))
    role = next(r for r in v.ENGINE_ROLES if "multiNode" in body["spec"][r])
    nodes = body["spec"][role]["multiNode"]["nodes"]
    argvs = [naive_argv(body, role, rank) for rank in range(nodes)]
    refused = [refusal(argv)[0] for argv in argvs if argv is not None]
    if any(refused):
        assert not verdict.compatible, (refused, body["spec"][role])
    if verdict.compatible:
        assert_vllm_starts(body)
