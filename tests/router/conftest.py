"""Router tier: the real vllm-router binary against emulated engines, all on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from loopback import free_ports
from pdmtp.core.render.membership import Prefill
from pdmtp.core.render.router import ROUTER_HEALTH_FLAGS, static_router_args
from router.emulator import EngineEmulator, EngineFactory, Role
from router.harness import (
    LOOPBACK,
    RouterFactory,
    RouterProcess,
    find_router_binary,
    without_flags,
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.router)
            # A wedged router or emulator must fail the test, not hang the tier.
            item.add_marker(pytest.mark.timeout(120))


@pytest.fixture(scope="session")
def router_binary() -> Path:
    path, why = find_router_binary()
    if path is None:
        if os.environ.get("PDMTP_REQUIRE_ALL") == "1":
            pytest.fail(f"router tier required (PDMTP_REQUIRE_ALL=1): {why}")
        pytest.skip(why)
    return path


@pytest.fixture
def engine() -> Iterator[EngineFactory]:
    """Start emulated engines; every one is stopped when the test ends."""
    started: list[EngineEmulator] = []

    def make(role: Role, name: str, **kwargs: Any) -> EngineEmulator:
        emu = EngineEmulator(role, name, **kwargs).start()
        started.append(emu)
        return emu

    yield make
    for emu in started:
        emu.stop()


@pytest.fixture
def start_router(router_binary: Path) -> Iterator[RouterFactory]:
    """Start vllm-router with `static_router_args` (the operator's renderer) on loopback."""
    started: list[RouterProcess] = []

    def start(
        prefills: Sequence[EngineEmulator],
        decodes: Sequence[EngineEmulator],
        *,
        policy: str = "round_robin",
        wait_ready: bool = True,
        health_checks: bool = True,
        extra_args: Sequence[str] = (),
    ) -> RouterProcess:
        port, metrics_port = free_ports(2)
        args = static_router_args(
            prefills=[Prefill(p.url, p.bootstrap_port) for p in prefills],
            decodes=[d.url for d in decodes],
            policy=policy,
            host=LOOPBACK,
            port=port,
            metrics_host=LOOPBACK,
            metrics_port=metrics_port,
        )
        if not health_checks:  # the baseline: the router's own defaults, as rendered before
            args = without_flags(args, ROUTER_HEALTH_FLAGS)
        args += extra_args  # argparse: a flag given twice, the last one counts
        router = RouterProcess(router_binary, args, port, metrics_port)
        started.append(router)
        return router.start(wait_ready=wait_ready)

    yield start
    for router in started:
        router.stop()
