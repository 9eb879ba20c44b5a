"""Engine and router processes for the CPU P/D tier, and talking to them over loopback.

Engines start the way the engine image starts them: `python -m pdmtp_engine.launcher <args>`
(its ENTRYPOINT) with the pod's env, pdmtp_engine imported from the work tree as the image
installs it, and vLLM's CPU build plus the tier's shim (`shim/sitecustomize.py`) underneath.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import psutil
from loopback import LOOPBACK
from wiring import REPO_ROOT

TIER_DIR: Final = Path(__file__).resolve().parent
SHIM_DIR: Final = TIER_DIR / "shim"
ENGINE_PACKAGE_DIR: Final = REPO_ROOT / "images" / "engine"

# What a GPU pod never needs and a CPU engine here does. The CPU platform sizes its KV cache from
# VLLM_CPU_KVCACHE_SPACE (GiB; default 4), where a GPU pod takes a share of GPU memory: 1 GiB is
# ~700k tokens of this tiny model and keeps three engines well inside a shared machine.
CPU_HOST_ENV: Final = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # Nothing may reach the hub; the checkpoint is local.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "MC_LOG_LEVEL": "WARNING",
}


def http(
    method: str, url: str, body: Mapping[str, Any] | None = None, *, timeout: float = 60.0
) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_by(
    samples: Mapping[str, float], name: str, *labels: str
) -> dict[tuple[str, ...], float]:
    """The samples of metric `name` summed by the values of `labels` (a front end over several
    engine ranks labels each rank's series `engine="<index>"`)."""
    found: dict[tuple[str, ...], float] = {}
    for key, value in samples.items():
        metric, _, rest = key.partition("{")
        if metric != name:
            continue
        values = dict(_LABEL.findall(rest))
        group = tuple(values.get(label, "") for label in labels)
        found[group] = found.get(group, 0.0) + value
    return found


def prometheus_samples(text: str) -> dict[str, float]:
    """`name{labels}` -> value for every sample line of a Prometheus text exposition."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the test process dies, however it dies.

    Engines run in their own sessions so that stop() can end exactly their process tree; without
    this, a killed pytest would leave ~4 GB engines behind. vLLM's own children follow their
    parent (death pipes), and the signal setting survives the launcher's exec of `vllm serve`.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


@dataclass
class ManagedProcess:
    """A process in its own session (so stop() ends exactly its tree), logging to a file."""

    name: str
    command: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    ended_at: float | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> ManagedProcess:
        self._log = self.log_path.open("wb")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            list(self.command),
            env=dict(self.env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        return self

    def exited(self) -> int | None:
        assert self.proc is not None
        return self.proc.poll()

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout=timeout)
        self.ended_at = time.monotonic()
        return code

    def elapsed(self) -> float:
        """Seconds from start to exit (or to now, if it still runs)."""
        end = self.ended_at if self.ended_at is not None else time.monotonic()
        return end - self.started_at

    def rss_bytes(self) -> int:
        """Resident memory of the process and every descendant (vLLM runs several)."""
        assert self.proc is not None
        try:
            root = psutil.Process(self.proc.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += process.memory_info().rss
        return total

    def stop(self, grace: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        # vLLM's engine core and workers may outlive a parent that died first: the session
        # holds them all.
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log(self, tail: int = 12000) -> str:
        text = self.log_path.read_bytes().decode(errors="replace")
        return text[-tail:]

    def wait_for_log(self, pattern: str, timeout: float) -> float:
        """Seconds from start until `pattern` (a regex) appears in the log; raises if the
        process exits first or the time runs out."""
        wanted = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if wanted.search(self.log(tail=10**7)):
                return time.monotonic() - self.started_at
            code = self.exited()
            if code is not None:
                raise RuntimeError(f"{self.name} exited {code} before {pattern!r}:\n{self.log()}")
            time.sleep(1)
        raise TimeoutError(f"{self.name}: no {pattern!r} in {timeout}s:\n{self.log()}")


def launcher_command(args: Sequence[str]) -> list[str]:
    """The engine image's ENTRYPOINT (`python3 -m pdmtp_engine.launcher`) with the pod's args."""
    return [sys.executable, "-m", "pdmtp_engine.launcher", *args]


MOONCAKE_LOGGER: Final = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector"


def write_logging_config(path: Path) -> Path:
    """vLLM's logging as usual (INFO), but DEBUG for its Mooncake connector, whose sender logs
    each KV push with its duration ("Sending to ... done, took S"): vLLM 0.32.0 exports no
    Mooncake transfer metric, and this is where the tier reads transfer times from."""
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(levelname)s %(asctime)s [%(name)s] %(message)s"}},
        "handlers": {
            "stdout": {
                "class": "logging.StreamHandler",
                "formatter": "plain",
                "level": "DEBUG",
                "stream": "ext://sys.stdout",
            }
        },
        "loggers": {
            "vllm": {"handlers": ["stdout"], "level": "INFO", "propagate": False},
            MOONCAKE_LOGGER: {"level": "DEBUG"},
        },
    }
    path.write_text(json.dumps(config, indent=2))
    return path


def engine_env(
    pod_env: Mapping[str, str],
    termination_log: Path,
    logging_config: Path,
    host_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The pod's env on top of this process's, plus what the CPU host and the venv need."""
    venv_bin = str(Path(sys.executable).parent)
    return {
        **os.environ,
        **CPU_HOST_ENV,
        **(host_env or {}),
        **pod_env,
        # `vllm` (what the launcher execs) from the tier's venv; pdmtp_engine from the work tree,
        # where the image installs it into site-packages; the shim first.
        "PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join([str(SHIM_DIR), str(ENGINE_PACKAGE_DIR)]),
        # Kubernetes' terminationMessagePath; no /dev/termination-log exists off a cluster.
        "PDMTP_TERMINATION_LOG": str(termination_log),
        "VLLM_LOGGING_CONFIG_PATH": str(logging_config),
    }


@dataclass
class Engine:
    """One vLLM engine started through the launcher."""

    process: ManagedProcess
    url: str
    termination_log: Path
    ready_after: float | None = None

    def wait_ready(
        self, timeout: float = 420.0, *, with_ranks: Sequence[ManagedProcess] = ()
    ) -> float:
        """Seconds from start to a 200 from /health; raises with the log tail otherwise, or as
        soon as this engine or one of its other ranks (`with_ranks`) exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in (self.process, *with_ranks):
                code = process.exited()
                if code is not None:
                    raise RuntimeError(
                        f"{process.name} exited {code} before serving:\n{process.log()}"
                    )
            with contextlib.suppress(OSError):
                if http("GET", self.url + "/health", timeout=2)[0] == 200:
                    self.ready_after = time.monotonic() - self.process.started_at
                    return self.ready_after
            time.sleep(1)
        raise TimeoutError(f"{self.process.name} not ready in {timeout}s:\n{self.process.log()}")

    def metrics_text(self) -> str:
        """The engine's /metrics answer, as a scraper gets it."""
        status, body = http("GET", self.url + "/metrics", timeout=10)
        assert status == 200, body[:500]
        return body.decode()

    def metrics(self) -> dict[str, float]:
        return prometheus_samples(self.metrics_text())

    def prompt_tokens_by_source(self) -> dict[str, float]:
        """vLLM's `vllm:prompt_tokens_by_source_total`, by source (summed over engine ranks)."""
        return prompt_tokens_by_source(self.metrics())

    def termination_message(self) -> str | None:
        if not self.termination_log.exists():
            return None
        return self.termination_log.read_text()


def prompt_tokens_by_source(samples: Mapping[str, float]) -> dict[str, float]:
    """`vllm:prompt_tokens_by_source_total` out of one scrape, by source."""
    by_source = metric_by(samples, "vllm:prompt_tokens_by_source_total", "source")
    return {source: value for (source,), value in by_source.items()}


def start_engine(
    name: str,
    command: Sequence[str],
    pod_env: Mapping[str, str],
    url: str,
    workdir: Path,
    *,
    host_env: Mapping[str, str] | None = None,
) -> Engine:
    """Start `command` (the launcher, or `vllm serve` for engines the launcher must refuse)."""
    termination_log = workdir / f"{name}.termination-log"
    termination_log.unlink(missing_ok=True)
    logging_config = workdir / "vllm-logging.json"
    if not logging_config.exists():
        write_logging_config(logging_config)
    process = ManagedProcess(
        name=name,
        command=command,
        env=engine_env(pod_env, termination_log, logging_config, host_env),
        log_path=workdir / f"{name}.log",
    ).start()
    return Engine(process=process, url=url, termination_log=termination_log)


@dataclass
class Router:
    """The real vllm-router binary, on loopback."""

    process: ManagedProcess
    port: int

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.process.exited()
            if code is not None:
                raise RuntimeError(f"vllm-router exited {code}:\n{self.process.log()}")
            with contextlib.suppress(OSError):
                if http("GET", self.url + "/readiness", timeout=2)[0] == 200:
                    return
            time.sleep(0.5)
        raise TimeoutError(f"vllm-router not ready in {timeout}s:\n{self.process.log()}")
