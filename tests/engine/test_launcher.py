"""The launcher refuses a config the operator did not expect and execs `vllm serve` otherwise.

Every scenario builds vLLM's real VllmConfig from `vllm serve` arguments and a local checkpoint
config. They run in fresh processes started together (see launcher_runner.py for why): one
batch with exec replaced by a recorder, and two runs of the real entrypoint,
`python -m pdmtp_engine.launcher`, whose os.execvp lands in a fake `vllm` on PATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pdmtp.api import vocabulary
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.core.agreement import check
from pdmtp.core.render.children import KV_ROLES, engine_pod_template
from pdmtp_engine import launcher
from pdmtp_engine.connector import BackoffMooncakeConnector
from vllm_harness import write_tiny_mtp_checkpoint

RUNNER = Path(__file__).with_name("launcher_runner.py")
FIXED = {
    "kv_connector": "BackoffMooncakeConnector",
    "kv_connector_module_path": "pdmtp_engine.connector",
}
STOCK = {"kv_connector": "MooncakeConnector"}


def serve_args(
    checkpoint: Path, kv_role: str, method: str | None = "mtp", k: int = 3, **connector: str
) -> list[str]:
    kv_transfer = {
        **(connector or FIXED),
        "kv_role": kv_role,
        "kv_connector_extra_config": {"mooncake_protocol": "tcp"},
    }
    args = ["vllm", "serve", str(checkpoint), "--block-size", "16", "--max-model-len", "4096"]
    if method is not None:
        args += [
            "--speculative-config",
            json.dumps({"method": method, "num_speculative_tokens": k}),
        ]
    return [*args, "--kv-transfer-config", json.dumps(kv_transfer)]


def write_tiny_mamba_checkpoint(directory: Path) -> Path:
    """A pure Mamba checkpoint config: state layers, so vLLM backs the prefill off a token."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["MambaForCausalLM"],
        "model_type": "mamba",
        "vocab_size": 1024,
        "hidden_size": 64,
        "state_size": 8,
        "num_hidden_layers": 2,
        "expand": 2,
        "conv_kernel": 4,
        "torch_dtype": "float16",
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def expectations(role: str, lookahead: int | None, backoff: int | None) -> dict[str, str]:
    env = {vocabulary.ENV_ROLE: role}
    if lookahead is not None:
        env[vocabulary.ENV_EXPECTED_LOOKAHEAD] = str(lookahead)
    if backoff is not None:
        env[vocabulary.ENV_EXPECTED_BACKOFF] = str(backoff)
    return env


def operator_rendered(checkpoint: Path, role: str, declared_mtp_modules: int) -> dict[str, Any]:
    """The args and env the operator renders for a role's engine container."""
    pdd = PDDeployment.model_validate(
        {
            "apiVersion": vocabulary.API_VERSION,
            "kind": vocabulary.KIND,
            "metadata": {"name": "demo", "namespace": "default", "uid": "uid-1"},
            "spec": {
                "model": {"name": str(checkpoint), "mtpModules": declared_mtp_modules},
                "image": "pdmtp-engine:test",
                "engine": {"blockSize": 16, "maxModelLen": 4096},
                "speculative": {"method": "mtp", "numSpeculativeTokens": 3},
                "kvTransfer": {"protocol": "tcp"},
                "prefill": {"replicas": 1, "tensorParallelSize": 1},
                "decode": {"replicas": 1, "tensorParallelSize": 1},
            },
        }
    )
    template = engine_pod_template(pdd, "rev1", role, check(pdd.spec))
    (container,) = template["spec"]["containers"]
    # valueFrom entries (the pod IP) only exist in a pod; the launcher does not read them.
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return {"argv": container["args"], "env": env}


@dataclass(frozen=True)
class EntrypointRun:
    returncode: int
    pid: int
    stderr: str
    fake_vllm_pid: str | None
    fake_vllm_argv: list[str] | None
    termination_message: str | None


@dataclass(frozen=True)
class Runs:
    batch: dict[str, dict[str, Any]]
    scenarios: dict[str, dict[str, Any]]
    accepted: EntrypointRun
    accepted_argv: list[str]
    refused: EntrypointRun


FAKE_VLLM_EXIT = 17


def write_fake_vllm(directory: Path) -> Path:
    """A `vllm` that records its pid and argv: after a real exec it has the launcher's pid."""
    directory.mkdir(parents=True, exist_ok=True)
    fake = directory / "vllm"
    fake.write_text(
        "#!/bin/sh\n"
        'echo "$$" > "$FAKE_VLLM_RECORD.pid"\n'
        'printf "%s\\n" "$0" "$@" > "$FAKE_VLLM_RECORD.argv"\n'
        f"exit {FAKE_VLLM_EXIT}\n"
    )
    fake.chmod(0o755)
    return directory


def start_entrypoint(
    argv: list[str], env: dict[str, str], scratch: Path, fake_bin: Path
) -> subprocess.Popen[str]:
    scratch.mkdir(parents=True, exist_ok=True)
    process_env = {
        **os.environ,
        **env,
        "PATH": f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "FAKE_VLLM_RECORD": str(scratch / "fake-vllm"),
        launcher.ENV_TERMINATION_LOG: str(scratch / "termination-log"),
        "VLLM_TARGET_DEVICE": "cpu",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "pdmtp_engine.launcher", *argv],
        env=process_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish_entrypoint(process: subprocess.Popen[str], scratch: Path) -> EntrypointRun:
    _, stderr = process.communicate(timeout=900)

    def read(path: Path) -> str | None:
        return path.read_text() if path.exists() else None

    argv_text = read(scratch / "fake-vllm.argv")
    pid_text = read(scratch / "fake-vllm.pid")
    return EntrypointRun(
        returncode=process.returncode,
        pid=process.pid,
        stderr=stderr,
        fake_vllm_pid=None if pid_text is None else pid_text.strip(),
        fake_vllm_argv=None if argv_text is None else argv_text.splitlines(),
        termination_message=read(scratch / "termination-log"),
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    root = tmp_path_factory.mktemp("launcher")
    mtp1 = write_tiny_mtp_checkpoint(root / "mtp1", 1)
    mtp3 = write_tiny_mtp_checkpoint(root / "mtp3", 3)
    mamba = write_tiny_mamba_checkpoint(root / "mamba")
    scenarios: dict[str, dict[str, Any]] = {
        "prefill_matches": {
            "argv": serve_args(mtp3, "kv_producer"),
            "env": expectations("prefill", 3, 2),
        },
        "decode_matches_without_vllm_word": {
            "argv": serve_args(mtp3, "kv_consumer")[1:],
            "env": expectations("decode", 3, 2),
        },
        "not_pinned_is_not_compared": {
            "argv": serve_args(mtp3, "kv_producer"),
            "env": expectations("prefill", None, None),
        },
        "single_module_checkpoint": {
            "argv": serve_args(mtp1, "kv_producer"),
            "env": expectations("prefill", 3, 2),
        },
        "backoff_mismatch": {
            "argv": serve_args(mtp3, "kv_consumer"),
            "env": expectations("decode", 3, 0),
        },
        "stock_connector": {
            "argv": serve_args(mtp3, "kv_producer", **STOCK),
            "env": expectations("prefill", 3, 2),
        },
        "kv_role_of_the_other_role": {
            "argv": serve_args(mtp3, "kv_producer"),
            "env": expectations("decode", 3, 2),
        },
        "no_speculation_expected_none": {
            "argv": serve_args(mtp3, "kv_producer", method=None),
            "env": expectations("prefill", 0, 0),
        },
        "mamba_state_backoff_expected": {
            "argv": serve_args(mamba, "kv_producer", method=None),
            "env": expectations("prefill", 0, 1),
        },
        "mamba_state_backoff_missed": {
            "argv": serve_args(mamba, "kv_consumer", method=None),
            "env": expectations("decode", 0, 0),
        },
        "unknown_role": {
            "argv": serve_args(mtp3, "kv_producer"),
            "env": expectations("router", 3, 2),
        },
        "vllm_rejects_k_not_multiple_of_modules": {
            "argv": serve_args(mtp3, "kv_producer", k=4),
            "env": expectations("prefill", 4, 3),
        },
        "unknown_flag": {
            "argv": [*serve_args(mtp3, "kv_producer"), "--no-such-flag"],
            "env": expectations("prefill", 3, 2),
        },
        "operator_prefill": operator_rendered(mtp3, "prefill", declared_mtp_modules=3),
        "operator_decode": operator_rendered(mtp3, "decode", declared_mtp_modules=3),
        "operator_understates_mtp_modules": operator_rendered(
            mtp3, "decode", declared_mtp_modules=1
        ),
    }
    scenarios_file = root / "scenarios.json"
    scenarios_file.write_text(json.dumps(scenarios))
    results_file = root / "results.json"
    batch = subprocess.Popen(
        [sys.executable, str(RUNNER), str(scenarios_file), str(results_file)],
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    fake_bin = write_fake_vllm(root / "bin")
    accepted_argv = serve_args(mtp3, "kv_consumer")
    accepted = start_entrypoint(
        accepted_argv, expectations("decode", 3, 2), root / "accepted", fake_bin
    )
    refused = start_entrypoint(
        serve_args(mtp1, "kv_consumer"), expectations("decode", 3, 2), root / "refused", fake_bin
    )
    try:
        _, batch_stderr = batch.communicate(timeout=900)
        assert batch.returncode == 0, batch_stderr[-4000:]
        yield Runs(
            batch=json.loads(results_file.read_text()),
            scenarios=scenarios,
            accepted=finish_entrypoint(accepted, root / "accepted"),
            accepted_argv=accepted_argv,
            refused=finish_entrypoint(refused, root / "refused"),
        )
    finally:
        for process in (batch, accepted, refused):
            if process.poll() is None:
                process.kill()
                process.wait()


REFUSED = "pdmtp-engine refused to start: "


def assert_refused(runs: Runs, name: str, reason: str) -> None:
    result = runs.batch[name]
    assert result["exit_code"] == launcher.EXIT_REFUSED
    assert result["exec"] is None
    assert result["termination_message"] == f"{REFUSED}{reason}\n"


def assert_accepted(runs: Runs, name: str) -> None:
    result = runs.batch[name]
    assert result["termination_message"] is None
    assert (result["exit_code"], result["exec_count"]) == (0, 1)
    argv = runs.scenarios[name]["argv"]
    full = argv if argv[0] == "vllm" else ["vllm", *argv]
    assert result["exec"] == ["vllm", full]


@pytest.mark.parametrize(
    "name",
    [
        "prefill_matches",
        "decode_matches_without_vllm_word",
        "not_pinned_is_not_compared",
        "no_speculation_expected_none",
        "mamba_state_backoff_expected",
        "operator_prefill",
        "operator_decode",
    ],
)
def test_matching_config_execs_vllm_serve_unchanged(runs: Runs, name: str) -> None:
    assert_accepted(runs, name)


def test_operator_rendering_pins_lookahead_and_backoff(runs: Runs) -> None:
    for name in ("operator_prefill", "operator_decode"):
        env = runs.scenarios[name]["env"]
        assert env[vocabulary.ENV_EXPECTED_LOOKAHEAD] == "3"
        assert env[vocabulary.ENV_EXPECTED_BACKOFF] == "2"


def test_operator_rendering_starts_the_metrics_only_listener_beside_vllm(runs: Runs) -> None:
    for name in ("operator_prefill", "operator_decode"):
        (relay,) = runs.batch[name]["started"]
        port = str(vocabulary.ENGINE_METRICS_PORT)
        upstream = f"http://127.0.0.1:{vocabulary.ENGINE_HTTP_PORT}/metrics"
        relay_module = ["-m", "pdmtp_engine.metrics_relay"]
        assert relay[1:] == [
            *relay_module,
            "--host",
            "0.0.0.0",
            "--port",
            port,
            "--upstream",
            upstream,
        ]
    # Refused: nothing started. Not asked for (no PDMTP_METRICS_PORT): nothing started.
    assert runs.batch["operator_understates_mtp_modules"]["started"] == []
    assert runs.batch["prefill_matches"]["started"] == []


def test_single_module_checkpoint_refused(runs: Runs) -> None:
    assert_refused(
        runs,
        "single_module_checkpoint",
        "lookahead mismatch: operator expects 3, vLLM computes 1 (method=mtp k=3 mtp_modules=1); "
        "prefill backoff mismatch: operator expects 2, vLLM computes 0 "
        "(lookahead=1 state_backoff=0: no state layers)",
    )


def test_backoff_mismatch_refused(runs: Runs) -> None:
    assert_refused(
        runs,
        "backoff_mismatch",
        "prefill backoff mismatch: operator expects 0, vLLM computes 2 "
        "(lookahead=3 state_backoff=0: no state layers)",
    )


def test_state_layers_backoff_the_operator_missed_is_caught(runs: Runs) -> None:
    assert_refused(
        runs,
        "mamba_state_backoff_missed",
        "prefill backoff mismatch: operator expects 0, vLLM computes 1 "
        "(lookahead=0 state_backoff=1: Mamba-style state layers)",
    )


def test_operator_understating_mtp_modules_is_caught(runs: Runs) -> None:
    """The spec says 1 MTP module, the checkpoint has 3: only the engine side can tell."""
    assert_refused(
        runs,
        "operator_understates_mtp_modules",
        "lookahead mismatch: operator expects 1, vLLM computes 3 (method=mtp k=3 mtp_modules=3); "
        "prefill backoff mismatch: operator expects 0, vLLM computes 2 "
        "(lookahead=3 state_backoff=0: no state layers)",
    )


def test_stock_connector_refused(runs: Runs) -> None:
    assert_refused(
        runs,
        "stock_connector",
        "kv connector mismatch: expected BackoffMooncakeConnector from pdmtp_engine.connector, "
        "got MooncakeConnector from vLLM",
    )


def test_kv_role_must_match_pod_role(runs: Runs) -> None:
    assert_refused(
        runs,
        "kv_role_of_the_other_role",
        "kv_role mismatch: role decode needs kv_consumer, got kv_producer",
    )


def test_unknown_role_refused(runs: Runs) -> None:
    assert_refused(runs, "unknown_role", "PDMTP_ROLE='router': expected one of prefill, decode")


def test_config_vllm_rejects_is_refused_with_vllm_reason(runs: Runs) -> None:
    result = runs.batch["vllm_rejects_k_not_multiple_of_modules"]
    assert result["exit_code"] == launcher.EXIT_REFUSED and result["exec"] is None
    message = result["termination_message"]
    assert message.startswith(f"{REFUSED}vLLM could not build the engine config: ")
    assert "num_speculative_tokens:4 must be divisible by n_predict=3" in message
    assert message.count("\n") == 1


def test_unknown_flag_refused_with_argparse_reason(runs: Runs) -> None:
    assert_refused(
        runs,
        "unknown_flag",
        "vLLM rejected the serve arguments: unrecognized arguments: --no-such-flag",
    )


def test_entrypoint_execs_vllm_in_place(runs: Runs) -> None:
    """The real `python -m pdmtp_engine.launcher` becomes `vllm`: same pid, same argv."""
    run = runs.accepted
    assert run.termination_message is None, run.stderr[-2000:]
    assert run.returncode == FAKE_VLLM_EXIT, run.stderr[-2000:]
    assert run.fake_vllm_pid == str(run.pid)
    assert run.fake_vllm_argv is not None
    assert run.fake_vllm_argv[1:] == runs.accepted_argv[1:]
    assert Path(run.fake_vllm_argv[0]).name == "vllm"


def test_entrypoint_refusal_exits_3_with_termination_message(runs: Runs) -> None:
    run = runs.refused
    assert run.returncode == launcher.EXIT_REFUSED, run.stderr[-2000:]
    assert run.fake_vllm_argv is None
    assert run.termination_message == (
        f"{REFUSED}lookahead mismatch: operator expects 3, vLLM computes 1 "
        "(method=mtp k=3 mtp_modules=1); prefill backoff mismatch: operator expects 2, vLLM "
        "computes 0 (lookahead=1 state_backoff=0: no state layers)\n"
    )


def test_launcher_and_operator_spell_the_contract_alike() -> None:
    assert launcher.ENV_ROLE == vocabulary.ENV_ROLE
    assert launcher.ENV_EXPECTED_LOOKAHEAD == vocabulary.ENV_EXPECTED_LOOKAHEAD
    assert launcher.ENV_EXPECTED_BACKOFF == vocabulary.ENV_EXPECTED_BACKOFF
    assert launcher.CONNECTOR_CLASS == vocabulary.CONNECTOR_CLASS
    assert launcher.CONNECTOR_MODULE == vocabulary.CONNECTOR_MODULE
    assert BackoffMooncakeConnector.__name__ == vocabulary.CONNECTOR_CLASS
    assert BackoffMooncakeConnector.__module__ == vocabulary.CONNECTOR_MODULE
    assert dict(KV_ROLES) == launcher.KV_ROLE_OF
    assert tuple(launcher.KV_ROLE_OF) == vocabulary.ENGINE_ROLES
