"""The engine image: the launcher, run as the operator renders the pod, reaches its verdict with
the image's own vLLM; the transfer engine and the fixed connector import; non-root, no
capabilities (so IPC_LOCK is not needed to start).

The pods come from `pdmtp render` of samples/demo.yaml: the container's args and env exactly as
rendered (the pod IP from the downward API becomes 127.0.0.1: the container has no network).
Only two variables are added, both because of where this runs, not what the pod is:
HF_HUB_OFFLINE=1 (no hub here) and VLLM_TARGET_DEVICE=cpu (no GPU, so vLLM could not infer a
device; on a GPU node it finds CUDA).

The checkpoint is the engine tier's approach: a tiny DeepSeek-V3-shaped config.json, no
weights, here laid out as a Hugging Face cache entry for the sample's model name and revision
and mounted at the image's HF_HOME, which is where a pod's model cache volume would go.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from image_harness import Podman
from versions import read_versions

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "samples" / "demo.yaml"
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
LAUNCHER_VERDICT = re.compile(r"^pdmtp-engine: (?P<facts>.*): starting vLLM$", re.MULTILINE)
REFUSED = 3
SITE_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}
NO_CAPABILITIES = ("--cap-drop=ALL", "--security-opt=no-new-privileges")


@dataclass(frozen=True)
class EnginePod:
    role: str
    args: list[str]
    env: dict[str, str]
    command: list[str] | None
    termination_path: str

    @property
    def model(self) -> str:
        return self.args[self.args.index("serve") + 1]

    @property
    def revision(self) -> str:
        return self.args[self.args.index("--revision") + 1]


def _env(container: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[entry["name"]] = "127.0.0.1"
        else:
            raise AssertionError(f"cannot resolve {entry} outside a pod")
    return env


def rendered_engine_pods(sample: Path) -> dict[str, EnginePod]:
    out = subprocess.run(
        [sys.executable, "-m", "pdmtp.cli", "render", str(sample)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    pods: dict[str, EnginePod] = {}
    for doc in yaml.safe_load_all(out):
        if not doc or doc.get("kind") != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            env = _env(container)
            role = env.get("PDMTP_ROLE")
            if role in ("prefill", "decode"):
                pods[role] = EnginePod(
                    role=role,
                    args=list(container["args"]),
                    env=env,
                    command=container.get("command"),
                    termination_path=container.get(
                        "terminationMessagePath", DEFAULT_TERMINATION_PATH
                    ),
                )
    assert set(pods) == {"prefill", "decode"}, f"rendered engine roles: {sorted(pods)}"
    return pods


def write_hf_cache_entry(hf_home: Path, model: str, revision: str, mtp_modules: int) -> None:
    """A Hugging Face cache entry for `model`@`revision` holding only a tiny config.json."""
    repo_dir = hf_home / "hub" / ("models--" + model.replace("/", "--"))
    snapshot = "0" * 40
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / revision).write_text(snapshot)
    (repo_dir / "snapshots" / snapshot).mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": 1024,
        "eos_token_id": 1023,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 16,
        "q_lora_rank": None,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 16,
        "v_head_dim": 16,
        "max_position_embeddings": 4096,
        "num_nextn_predict_layers": mtp_modules,
        "torch_dtype": "bfloat16",
    }
    (repo_dir / "snapshots" / snapshot / "config.json").write_text(json.dumps(config))
    for path in [hf_home, *hf_home.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # the image's user is not root


@dataclass(frozen=True)
class LauncherRun:
    returncode: int
    output: str
    termination_message: str


@pytest.fixture(scope="module")
def pods() -> dict[str, EnginePod]:
    return rendered_engine_pods(SAMPLE)


@pytest.fixture(scope="module")
def declared_mtp_modules() -> int:
    spec = yaml.safe_load(SAMPLE.read_text())["spec"]
    modules = int(spec["model"]["mtpModules"])
    assert modules > 1, "the sample must use multi-module MTP, where a mismatch shifts the KV"
    return modules


@pytest.fixture(scope="module")
def runs(
    podman_session: Podman,
    engine_image: str,
    pods: dict[str, EnginePod],
    declared_mtp_modules: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, LauncherRun]:
    """Three pods at once (each loads torch and vLLM): prefill and decode against a checkpoint
    with the modules the spec declares, and the decode pod against one with a single module."""
    hf_home_in_image = next(
        e.split("=", 1)[1]
        for e in podman_session.image_config(engine_image)["Env"]
        if e.startswith("HF_HOME=")
    )
    scenarios = {
        "prefill": (pods["prefill"], declared_mtp_modules),
        "decode": (pods["decode"], declared_mtp_modules),
        "decode_single_module_checkpoint": (pods["decode"], 1),
    }
    started = []
    for name, (pod, modules) in scenarios.items():
        root = tmp_path_factory.mktemp(name)
        write_hf_cache_entry(root / "hf", pod.model, pod.revision, modules)
        termination = root / "termination-log"
        termination.touch()
        termination.chmod(0o666)  # as the kubelet makes it: writable for any uid
        options = [
            *NO_CAPABILITIES,
            f"--volume={root / 'hf'}:{hf_home_in_image}:ro",
            f"--volume={termination}:{pod.termination_path}",
        ]
        for key, value in {**pod.env, **SITE_ENV}.items():
            options.append(f"--env={key}={value}")
        if pod.command is not None:
            options.append("--entrypoint=" + json.dumps(pod.command))
        _, process = podman_session.popen(engine_image, pod.args, options=options)
        started.append((name, process, termination))
    results: dict[str, LauncherRun] = {}
    try:
        for name, process, termination in started:
            output, _ = process.communicate(timeout=600)
            results[name] = LauncherRun(process.returncode, output, termination.read_text())
    finally:
        for _, process, _ in started:
            process.kill()
        podman_session.remove_all()
    return results


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_matching_config_gets_to_exec_vllm_serve(
    role: str, runs: dict[str, LauncherRun], pods: dict[str, EnginePod]
) -> None:
    run = runs[role]
    verdicts = LAUNCHER_VERDICT.findall(run.output)
    assert len(verdicts) == 1, f"launcher verdict lines: {verdicts}\n{run.output[-4000:]}"
    facts = verdicts[0]
    env = pods[role].env
    assert f"lookahead={env['PDMTP_EXPECTED_LOOKAHEAD']}," in facts
    assert f"prefill_backoff={env['PDMTP_EXPECTED_PREFILL_BACKOFF']}," in facts
    assert f"kv_role={'kv_producer' if role == 'prefill' else 'kv_consumer'}" in facts
    # What follows is vLLM's own server, in the launcher's process (exec keeps pid 1): vLLM
    # 0.33.0 tags its log lines with the process name and pid. It then fails here (no GPU, no
    # tokenizer), which is not the launcher refusing.
    after = run.output.split(verdicts[0], 1)[1]
    assert re.search(r"\(APIServer pid=1\)", after), after[-4000:]
    assert "pdmtp_engine/launcher.py" not in after, after[-4000:]
    assert run.returncode not in (0, REFUSED), run.output[-4000:]
    assert run.termination_message == ""
    # Beside vLLM, the metrics-only listener the pod's env asks for (its NetworkPolicy port).
    port = env["PDMTP_METRICS_PORT"]
    assert f"metrics-only listener on 0.0.0.0:{port} -> http://127.0.0.1:8000/metrics" in after


def test_mismatch_exits_3_with_the_reason_in_the_termination_message(
    runs: dict[str, LauncherRun], pods: dict[str, EnginePod], declared_mtp_modules: int
) -> None:
    run = runs["decode_single_module_checkpoint"]
    assert run.returncode == REFUSED, run.output[-4000:]
    assert not LAUNCHER_VERDICT.search(run.output)
    expected = pods["decode"].env["PDMTP_EXPECTED_LOOKAHEAD"]
    assert int(expected) == declared_mtp_modules
    message = run.termination_message
    assert message.startswith("pdmtp-engine refused to start: "), message
    # A single-module checkpoint gives lookahead 1 whatever k is (DESIGN.md section 1).
    assert f"lookahead mismatch: operator expects {expected}, vLLM computes 1" in message
    assert message.count("\n") == 1, "one line, as Kubernetes shows it"


def test_transfer_engine_and_connector_import_with_the_pinned_versions(
    podman: Podman, engine_image: str
) -> None:
    pins = read_versions()
    # The image installs the CUDA build of the transfer engine, a distribution of its own name.
    script = (
        "import json, importlib.metadata as m, mooncake.engine, pdmtp_engine.connector; "
        "c = pdmtp_engine.connector.BackoffMooncakeConnector; "
        "mooncake = [d.version for d in m.distributions() "
        "if d.metadata['Name'].startswith('mooncake-transfer-engine')]; "
        "print(json.dumps([m.version('vllm'), mooncake, c.__module__ + '.' + c.__name__]))"
    )
    result = podman.run(
        engine_image,
        ["-c", script],
        options=[*NO_CAPABILITIES, "--entrypoint=python3"],
        timeout=300,
    )
    assert result.returncode == 0, result.output[-4000:]
    versions = json.loads(result.output.strip().splitlines()[-1])
    assert versions == [
        pins["VLLM_VERSION"],
        [pins["MOONCAKE_VERSION"]],
        "pdmtp_engine.connector.BackoffMooncakeConnector",
    ]


def test_runs_as_a_fixed_non_root_uid(podman: Podman, engine_image: str) -> None:
    assert podman.image_config(engine_image)["User"] == "10001"
    result = podman.run(engine_image, ["-c", "id -u"], options=["--entrypoint=sh"])
    assert result.returncode == 0, result.output
    assert result.output.split() == ["10001"]
