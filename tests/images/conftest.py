"""Images tier: the operator, router and engine images, built by `make images`, run with podman.

Each test runs an image the way its Kubernetes pod would (its entrypoint, the arguments and
environment the operator renders, non-root, capabilities dropped) with no network, or with the
host's loopback where it must reach a server the test started there.

An image must be present and current (its io.pdmtp.inputs label equal to the hash of today's
Dockerfile and sources, see hack/lib/build_images.py), so the tier never passes on a stale
build.
Missing podman or images skip the tier, or fail it when PDMTP_REQUIRE_ALL=1 (as `make` runs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from build_images import INPUTS_LABEL, BuildError, input_hash, podman_environ, specs
from image_harness import Podman

TESTS_DIR = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "images: needs podman and the images `make images` builds")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if TESTS_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.images)
            # A wedged container must fail its test, not hang the tier.
            item.add_marker(pytest.mark.timeout(900))


def _unavailable(why: str) -> None:
    if os.environ.get("PDMTP_REQUIRE_ALL") == "1":
        pytest.fail(f"images tier required (PDMTP_REQUIRE_ALL=1): {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def podman_session() -> Podman:
    if shutil.which("podman") is None:
        _unavailable("podman is not installed; `make images` installs it (hack/podman-env.sh)")
    try:
        env = podman_environ()
    except (subprocess.CalledProcessError, BuildError) as error:
        _unavailable(f"hack/podman-env.sh failed: {error}")
    return Podman(env)


@pytest.fixture
def podman(podman_session: Podman) -> Iterator[Podman]:
    """podman, removing every container the test started when it ends."""
    yield podman_session
    podman_session.remove_all()


def _current(podman: Podman, key: str) -> str:
    all_specs = specs()
    spec = all_specs[key]
    done = subprocess.run(
        [
            "podman",
            "image",
            "inspect",
            "--format",
            f'{{{{index .Labels "{INPUTS_LABEL}"}}}}',
            spec.name,
        ],
        capture_output=True,
        text=True,
        env=dict(podman.env),
    )
    if done.returncode != 0:
        _unavailable(f"{spec.name} is not built; run `make images`")
    expected = input_hash(spec, all_specs)
    if done.stdout.strip() != expected:
        _unavailable(
            f"{spec.name} is stale (inputs {done.stdout.strip()!r}, sources say {expected!r}); "
            "run `make images`"
        )
    return spec.name


@pytest.fixture(scope="session")
def operator_image(podman_session: Podman) -> str:
    return _current(podman_session, "operator")


@pytest.fixture(scope="session")
def router_image(podman_session: Podman) -> str:
    return _current(podman_session, "router")


@pytest.fixture(scope="session")
def engine_image(podman_session: Podman) -> str:
    return _current(podman_session, "engine")
