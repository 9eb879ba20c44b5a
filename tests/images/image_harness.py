"""Run the project's images with podman, as the images tier needs them (test code).

Every container gets a name with the prefix below and is removed when its test ends, whatever
happened. Networks: `none` unless a test needs the host's loopback (`host`, every server bound
to 127.0.0.1).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NAME_PREFIX = "pdmtp-images-test-"


@dataclass(frozen=True)
class Result:
    returncode: int
    output: str
    """stdout and stderr, interleaved as the container wrote them."""


@dataclass
class Podman:
    env: Mapping[str, str]
    started: list[str] = field(default_factory=list)

    def _cmd(self, args: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", *args], capture_output=True, text=True, env=dict(self.env), timeout=timeout
        )

    def image_config(self, image: str) -> dict[str, Any]:
        done = self._cmd(["image", "inspect", image])
        assert done.returncode == 0, done.stderr
        (info,) = json.loads(done.stdout)
        config: dict[str, Any] = info["Config"]
        return config

    def run_args(
        self,
        image: str,
        args: Sequence[str] = (),
        *,
        network: str = "none",
        options: Sequence[str] = (),
        detach: bool = False,
    ) -> tuple[str, list[str]]:
        name = NAME_PREFIX + uuid.uuid4().hex[:10]
        self.started.append(name)
        cmd = ["podman", "run", "--name", name, f"--network={network}"]
        cmd += ["--detach"] if detach else ["--rm"]
        return name, [*cmd, *options, image, *args]

    def run(
        self,
        image: str,
        args: Sequence[str] = (),
        *,
        network: str = "none",
        options: Sequence[str] = (),
        timeout: float = 120,
    ) -> Result:
        """Run to completion; a container still running at `timeout` is removed and fails."""
        name, cmd = self.run_args(image, args, network=network, options=options)
        try:
            done = subprocess.run(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=dict(self.env),
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as expired:
            self.remove(name)
            raise AssertionError(f"{' '.join(cmd)} still running after {timeout}s") from expired
        return Result(done.returncode, done.stdout)

    def popen(
        self,
        image: str,
        args: Sequence[str] = (),
        *,
        network: str = "none",
        options: Sequence[str] = (),
    ) -> tuple[str, subprocess.Popen[str]]:
        """Start attached, for several containers that run at once."""
        name, cmd = self.run_args(image, args, network=network, options=options)
        process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(self.env)
        )
        return name, process

    def start(
        self,
        image: str,
        args: Sequence[str] = (),
        *,
        network: str = "none",
        options: Sequence[str] = (),
    ) -> str:
        """Start detached; returns the container's name."""
        name, cmd = self.run_args(image, args, network=network, options=options, detach=True)
        done = subprocess.run(cmd, capture_output=True, text=True, env=dict(self.env), timeout=60)
        assert done.returncode == 0, f"{' '.join(cmd)}: {done.stderr}"
        return name

    def logs(self, name: str) -> str:
        done = self._cmd(["logs", name])
        return done.stdout + done.stderr

    def running(self, name: str) -> bool:
        done = self._cmd(["inspect", "--format", "{{.State.Running}}", name])
        return done.returncode == 0 and done.stdout.strip() == "true"

    def remove(self, name: str) -> None:
        self._cmd(["rm", "--force", "--time", "5", name])

    def remove_all(self) -> None:
        for name in self.started:
            self.remove(name)
        self.started.clear()


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str, str]:
    """(status, content type, body); loopback only, never through a proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            body = response.read().decode(errors="replace")
            return response.status, response.headers.get_content_type(), body
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get_content_type(), error.read().decode(errors="replace")


def wait_http_ok(
    url: str, *, timeout: float, alive: Any = None, describe: Any = None
) -> tuple[str, str]:
    """Poll until `url` answers 200; returns (content type, body).

    `alive()` returning False ends the wait early (the container died); `describe()` adds its
    logs to the failure.
    """
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            status, content_type, body = http_get(url)
            if status == 200:
                return content_type, body
            last = f"HTTP {status}: {body[:200]}"
        except OSError as error:
            last = str(error)
        if alive is not None and not alive():
            break
        time.sleep(0.3)
    extra = f"\n{describe()}" if describe is not None else ""
    raise AssertionError(f"{url} did not answer 200 ({last}){extra}")
