"""The tier runs against exactly what the image pins (hack/engine-venv.sh builds that venv)."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import vllm
from versions import read_versions

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
    assert vllm.__version__ == version("vllm") == read_versions()["VLLM_VERSION"]


def test_transfer_engine_is_the_cpu_build_of_the_image_pin() -> None:
    assert version("mooncake-transfer-engine-non-cuda") == read_versions()["MOONCAKE_VERSION"]


def test_test_tools_are_pinned_versions() -> None:
    for name, pinned in pins(TEST_REQUIREMENTS).items():
        assert version(name) == pinned, name
