"""versions.env is the one place a version is pinned: the shell and Python readers agree on it, no
script or Dockerfile writes a pin again, and the router pin matches the copies pip and the
operator need in their own formats."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pdmtp
import pytest
import yaml
from pdmtp.api.vocabulary import ROUTER_VERSION
from versions import VERSIONS_FILE, read_versions

REPO = Path(__file__).resolve().parents[2]


def bash_versions(environ: dict[str, str], versions_file: Path | None = None) -> dict[str, str]:
    """The pins as hack/versions.sh sets them (optionally loading another file)."""
    script = (
        "source hack/versions.sh || exit 3\n"
        + (f"versions_file={versions_file}; load_versions || exit 3\n" if versions_file else "")
        + 'for key in "$@"; do printf "%s=%s\\n" "$key" "${!key}"; done'
    )
    keys = list(read_versions(versions_file or VERSIONS_FILE, {}))
    done = subprocess.run(
        ["bash", "-c", script, "bash", *keys],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", **environ},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise ValueError(done.stderr)
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


def test_bash_and_python_read_the_same_pins() -> None:
    pins = read_versions(environ={})
    assert {"K8S_VERSION", "VLLM_VERSION", "MOONCAKE_VERSION", "UV_VERSION"} <= pins.keys()
    assert bash_versions({}) == pins


def test_pdmtp_key_overrides_key_in_both() -> None:
    environ = {"PDMTP_K8S_VERSION": "v1.99.0"}
    pins = read_versions(environ=environ)
    assert pins["K8S_VERSION"] == "v1.99.0"
    assert bash_versions(environ) == pins


@pytest.mark.parametrize(
    "line", ['QUOTED="1.0"', "EXPANDED=$HOME", "SPACED = 1.0", "lower=1.0", "INLINE=1.0 # no"]
)
def test_both_refuse_a_line_that_is_not_a_plain_pin(tmp_path: Path, line: str) -> None:
    bad = tmp_path / "versions.env"
    bad.write_text(f"# a comment\nGOOD=1.0\n{line}\n")
    with pytest.raises(ValueError, match=":3:"):
        read_versions(bad, {})
    with pytest.raises(ValueError, match=":3:"):
        bash_versions({}, bad)


def test_both_refuse_a_pin_written_twice(tmp_path: Path) -> None:
    twice = tmp_path / "versions.env"
    twice.write_text("A=1\nA=2\n")
    with pytest.raises(ValueError, match=":2:"):
        read_versions(twice, {})
    with pytest.raises(ValueError, match=":2:"):
        bash_versions({}, twice)


def scripts() -> list[Path]:
    return [
        REPO / "Makefile",
        *sorted((REPO / "hack").rglob("*.sh")),
        *sorted((REPO / "hack" / "lib").glob("*.py")),
        *sorted((REPO / "tests" / "support").glob("*.py")),
    ]


def test_no_script_spells_a_pinned_version() -> None:
    pins = read_versions(environ={})
    found = [
        f"{path.relative_to(REPO)}: {key}={value}"
        for path in scripts()
        for key, value in pins.items()
        if re.search(rf"(?<![\w.]){re.escape(value)}(?![\w.])", path.read_text())
    ]
    assert found == []


def test_no_dockerfile_defaults_a_pinned_build_arg() -> None:
    keys = "|".join(read_versions(environ={}))
    files = [*(REPO / "images").rglob("Dockerfile"), *(REPO / "images").rglob("Containerfile")]
    assert files
    defaulted = [
        f"{path.relative_to(REPO)}: {arg}"
        for path in files
        for arg in re.findall(rf"^ARG (?:{keys})=.*$", path.read_text(), re.M)
    ]
    assert defaulted == []


def test_the_router_pin_is_what_the_operator_deploys_and_pip_installs() -> None:
    def pinned(requirement_lines: list[str]) -> list[str]:
        return [
            line.split("==", 1)[1].split()[0]
            for line in requirement_lines
            if line.startswith("vllm-router==")
        ]

    lock = (REPO / "images" / "router" / "requirements.txt").read_text().splitlines()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    test_extra = pyproject["project"]["optional-dependencies"]["test"]
    pin = read_versions(environ={})["VLLM_ROUTER_VERSION"]
    assert pin == ROUTER_VERSION
    assert pinned(lock) == [pin]
    assert pinned(test_extra) == [pin]


def test_the_chart_version_and_app_version_are_the_project_version() -> None:
    """charts/pdmtp is released with the operator: one version for both (and the image tag the
    chart deploys by default is its appVersion)."""
    chart = yaml.safe_load((REPO / "charts" / "pdmtp" / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert (chart["version"], chart["appVersion"]) == (project, project)


def test_the_installed_operator_reports_the_project_version() -> None:
    """pdmtp.__version__ (the log's first line, pdmtp_build_info, --version) is read from the
    installed metadata: an install older than pyproject.toml would report a stale release."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert pdmtp.__version__ == project, "reinstall (`make venv`): the venv's pdmtp is stale"


def test_the_previous_release_tag_names_the_pinned_commit() -> None:
    """The upgrade tests build the previous release from its pinned commit (a clone may lack
    tags); where the tag is present it must be that commit. It is older than this tree."""
    pins = read_versions()
    tag, commit = pins["PREVIOUS_RELEASE"], pins["PREVIOUS_RELEASE_COMMIT"]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert tag != f"v{project}", "PREVIOUS_RELEASE must be an older release than this tree"
    assert re.fullmatch(r"[0-9a-f]{40}", commit), commit
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if found.returncode == 0:
        assert found.stdout.strip() == commit, f"tag {tag} is {found.stdout.strip()}, not {commit}"
