"""The router image: vllm-router starts with the operator's rendered arguments, non-root.

The engines it routes to are the router tier's emulators on the host's 127.0.0.1; the container
shares the host's network namespace and binds only 127.0.0.1 (the arguments say so). It runs as
the rendered pod runs it: read-only root with a /tmp volume, every capability dropped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from image_harness import Podman, http_get, wait_http_ok
from loopback import free_ports
from pdmtp.core.render.router import ROUTER_LIVENESS_PATH, ROUTER_READINESS_PATH, static_router_args
from router.emulator import EngineEmulator

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "images" / "router" / "requirements.txt"
POD_LIKE = ("--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges")


def test_runs_as_a_fixed_non_root_uid(podman: Podman, router_image: str) -> None:
    assert podman.image_config(router_image)["User"] == "10001:10001"
    result = podman.run(router_image, ["-c", "id -u; id -g"], options=["--entrypoint=sh"])
    assert result.returncode == 0, result.output
    assert result.output.split() == ["10001", "10001"]


def test_the_hash_pinned_wheels_are_what_is_installed(podman: Podman, router_image: str) -> None:
    # The build installs requirements.txt with --require-hashes; check it is exactly what the
    # image holds, so an unpinned extra or a drifted version cannot slip in.
    pinned = dict(
        re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", REQUIREMENTS.read_text(), flags=re.MULTILINE)
    )
    script = (
        "import json, importlib.metadata as m; "
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    result = podman.run(router_image, ["-c", script], options=["--entrypoint=python3"])
    assert result.returncode == 0, result.output
    installed = json.loads(result.output.strip().splitlines()[-1])

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    installed = {norm(name): version for name, version in installed.items()}
    wrong = {
        name: (version, installed.get(norm(name)))
        for name, version in pinned.items()
        if installed.get(norm(name)) != version
    }
    assert not wrong, f"pinned vs installed: {wrong}"
    assert pinned["vllm-router"] == installed["vllm-router"]


def test_starts_with_rendered_args_and_answers_health(podman: Podman, router_image: str) -> None:
    prefill = EngineEmulator("prefill", "p0").start()
    decode = EngineEmulator("decode", "d0").start()
    try:
        port, metrics_port = free_ports(2)
        args = static_router_args(
            prefills=[(prefill.url, prefill.bootstrap_port)],
            decodes=[decode.url],
            policy="round_robin",
            host="127.0.0.1",
            port=port,
            metrics_host="127.0.0.1",
            metrics_port=metrics_port,
        )
        name = podman.start(router_image, args, network="host", options=[*POD_LIKE, "--tmpfs=/tmp"])
        base = f"http://127.0.0.1:{port}"
        # The router listens only once every engine is healthy and each prefill's bootstrap
        # server has told it the engine id: readiness proves it reached both from the container.
        wait_http_ok(
            base + ROUTER_READINESS_PATH,
            timeout=60,
            alive=lambda: podman.running(name),
            describe=lambda: podman.logs(name),
        )
        status, _, body = http_get(base + ROUTER_LIVENESS_PATH)
        assert status == 200, body
        assert prefill.bootstrap_queries >= 1
        status, _, metrics = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert status == 200
        assert metrics.strip(), "empty metrics page"
    finally:
        prefill.stop()
        decode.stop()
