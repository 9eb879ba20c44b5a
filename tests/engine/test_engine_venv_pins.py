"""The tier runs against exactly what the image pins (hack/engine-venv.sh builds that venv)."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import vllm

ENGINE_IMAGE_DIR = Path(__file__).resolve().parents[2] / "images" / "engine"
TEST_REQUIREMENTS = Path(__file__).with_name("requirements.txt")


def pins(requirements: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, pinned = line.partition("==")
            assert pinned, f"{requirements}: {line!r} is not pinned with =="
            found[name] = pinned
    return found


def test_vllm_is_the_image_base_version() -> None:
    dockerfile = (ENGINE_IMAGE_DIR / "Dockerfile").read_text()
    match = re.search(r"^ARG VLLM_VERSION=(\S+)$", dockerfile, re.MULTILINE)
    assert match is not None
    assert vllm.__version__ == version("vllm") == match.group(1)


def test_transfer_engine_is_the_cpu_build_of_the_image_pin() -> None:
    image_pins = pins(ENGINE_IMAGE_DIR / "requirements.txt")
    (cuda_build,) = [name for name in image_pins if name.startswith("mooncake-transfer-engine")]
    assert version("mooncake-transfer-engine-non-cuda") == image_pins[cuda_build]


def test_test_tools_are_pinned_versions() -> None:
    for name, pinned in pins(TEST_REQUIREMENTS).items():
        assert version(name) == pinned, name
