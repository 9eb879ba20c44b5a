"""Start the real vllm-router on 127.0.0.1 and talk to it (test code)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from pdmtp.api.vocabulary import ROUTER_VERSION
from pdmtp.core.render.router import ROUTER_READINESS_PATH

ROUTER_BINARY = "vllm-router"

LOOPBACK = "127.0.0.1"
ENV_BINARY = "PDMTP_VLLM_ROUTER"
"""Override: the path of a vllm-router executable (for example from the router image)."""


def find_router_binary() -> tuple[Path | None, str]:
    """The pinned vllm-router executable, or None and why not.

    The PyPI wheel installs a console script next to the interpreter that installed it (the
    venv's scripts directory), which a bare PATH lookup misses when the venv is not activated.
    """
    override = os.environ.get(ENV_BINARY)
    if override:
        path = Path(override)
        return (
            (path, "")
            if os.access(path, os.X_OK)
            else (None, f"{ENV_BINARY}={override} is not executable")
        )
    try:
        installed = metadata.version("vllm-router")
    except metadata.PackageNotFoundError:
        return None, f"no vllm-router in {sys.prefix}: pip install vllm-router=={ROUTER_VERSION}"
    if installed != ROUTER_VERSION:
        return None, f"vllm-router {installed} is installed; the project pins {ROUTER_VERSION}"
    for candidate in (
        Path(sysconfig.get_path("scripts")) / ROUTER_BINARY,
        shutil.which(ROUTER_BINARY),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate), ""
    return None, f"vllm-router {installed} is installed but no {ROUTER_BINARY} executable was found"


@dataclass
class RouterProcess:
    """One vllm-router process, its own process group, its log in a temp file."""

    binary: Path
    args: list[str]
    port: int
    metrics_port: int
    env: Mapping[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] = field(default_factory=lambda: tempfile.TemporaryFile())  # noqa: SIM115

    @property
    def base(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, *, wait_ready: bool = True, timeout: float = 30.0) -> RouterProcess:
        self.proc = subprocess.Popen(
            [str(self.binary), *self.args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=dict(self.env) if self.env is not None else None,
            start_new_session=True,  # its own group, so stop() ends exactly what we started
        )
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm-router exited {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError):
                if get(self.base + ROUTER_READINESS_PATH, timeout=1)[0] == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"vllm-router not ready after {timeout}s:\n{self.log()}")

    def wait_all_healthy(self, timeout: float = 15.0) -> None:
        """Until `/readiness` counts every prefill and decode healthy: a worker whose health
        probe failed (a restart) is picked again only after two good probes."""
        deadline = time.monotonic() + timeout
        body = b""
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                status, body = get(self.base + ROUTER_READINESS_PATH, timeout=1)
                counts = json.loads(body) if status == 200 else {}
                roles = [counts.get(role, {}) for role in ("prefill", "decode")]
                if all(r and r.get("healthy") == r.get("total") for r in roles):
                    return
            time.sleep(0.2)
        raise TimeoutError(f"not every worker healthy after {timeout}s: {body!r}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)

    def log(self) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-20000:]


def without_flags(args: list[str], flags: Sequence[str]) -> list[str]:
    """`args` with the run `flags` taken out (it must be there, once)."""
    n = len(flags)
    at = [i for i in range(len(args) - n + 1) if args[i : i + n] == list(flags)]
    assert len(at) == 1, f"{list(flags)} not rendered once in {args}"
    return args[: at[0]] + args[at[0] + n :]


RouterFactory = Callable[..., RouterProcess]
"""The `start_router` fixture: `start_router(prefills, decodes, policy=..., wait_ready=...,
health_checks=..., extra_args=...)`; `health_checks=False` leaves out `ROUTER_HEALTH_FLAGS` (the
baseline), `extra_args` are appended to the rendered args."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def sse(self) -> list[Any]:
        """The `data:` events of a server-sent-events body, `[DONE]` kept as the string."""
        events: list[Any] = []
        for line in self.body.decode().splitlines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
        return events


def get(url: str, *, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post(base: str, path: str, body: Mapping[str, Any], *, timeout: float = 20.0) -> Reply:
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Reply(r.status, r.read())
    except urllib.error.HTTPError as e:
        return Reply(e.code, e.read())


def completion_body(*, stream: bool = False, max_tokens: int = 7) -> dict[str, Any]:
    return {
        "model": "emulated/model",
        "prompt": "Hello",
        "max_tokens": max_tokens,
        "stream": stream,
    }


def chat_body(*, stream: bool = False, max_tokens: int = 7) -> dict[str, Any]:
    return {
        "model": "emulated/model",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def body_for(path: str, *, stream: bool) -> dict[str, Any]:
    return (
        chat_body(stream=stream)
        if path.endswith("chat/completions")
        else completion_body(stream=stream)
    )


def text_of(reply: Reply, *, chat: bool, stream: bool) -> str:
    """The generated text as the client sees it."""
    if not stream:
        choice = reply.json()["choices"][0]
        return str(choice["message"]["content"] if chat else choice["text"])
    parts = []
    for event in reply.sse():
        if event == "[DONE]":
            continue
        choice = event["choices"][0]
        parts.append(choice["delta"].get("content", "") if chat else choice["text"])
    return "".join(parts).strip()
