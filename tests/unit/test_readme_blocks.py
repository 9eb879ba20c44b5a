"""README.md's generated tables (pdmtp.tools.readme) are what their sources render: the
troubleshooting table from the reasons registry, the autoscaling defaults from the API's table."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from pdmtp.api.autoscaling import defaults_markdown
from pdmtp.api.reasons import REASONS, WARNING_REASONS
from pdmtp.tools import readme

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def block(text: str, name: str) -> str:
    """What lies between a generated block's markers."""
    match = re.search(
        rf"^<!-- generated:{name} -->\n(.*?)^<!-- /generated:{name} -->$", text, re.M | re.S
    )
    assert match, f"no generated block {name!r}"
    return match[1]


def test_the_readme_is_what_its_sources_render() -> None:
    text = README.read_text(encoding="utf-8")
    assert readme.refresh(text) == text, "run: make generate"


def test_every_reason_is_in_the_troubleshooting_table() -> None:
    table = block(README.read_text(encoding="utf-8"), "troubleshooting")
    named = set(re.findall(r"`([A-Za-z]+)`", table))
    assert [r.name for r in REASONS if r.name not in named] == []


def test_the_autoscaling_defaults_are_the_apis() -> None:
    shown = block(README.read_text(encoding="utf-8"), "autoscaling-defaults")
    assert shown == defaults_markdown().rstrip("\n") + "\n"


def test_a_reason_that_reports_a_problem_says_what_to_do() -> None:
    """A symptom and an action come together, and every reason posted as a Warning has both."""
    half = [r.name for r in REASONS if bool(r.symptom) != bool(r.action)]
    assert half == []
    silent_warnings = [r.name for r in REASONS if r.name in WARNING_REASONS and not r.action]
    assert silent_warnings == []


def test_each_problem_reason_has_its_own_row_and_the_rest_share_one() -> None:
    rows = readme.troubleshooting_markdown().splitlines()[2:]
    problems = [r for r in REASONS if r.action]
    assert len(rows) == len(problems) + 1
    for row, reason in zip(rows[:-1], problems, strict=True):
        assert f"`{reason.name}`" in row and reason.action.replace("|", "\\|") in row
    assert rows[-1].endswith("| nothing |")
    assert "`RolloutComplete`" in rows[-1] and "`Created`" in rows[-1]


# ---- refresh and the command line


def two_blocks(a: str = "A", b: str = "B") -> dict[str, Callable[[], str]]:
    return {"one": lambda: a, "two": lambda: b}


TEXT = """# title
<!-- generated:one -->
stale
lines
<!-- /generated:one -->
between
<!-- generated:two -->
<!-- /generated:two -->
end
"""


def test_refresh_replaces_only_what_is_between_the_markers() -> None:
    fresh = readme.refresh(TEXT, two_blocks("A1\nA2", "B\n"))
    assert fresh == TEXT.replace("stale\nlines\n", "A1\nA2\n").replace(
        "<!-- generated:two -->\n", "<!-- generated:two -->\nB\n"
    )
    assert readme.refresh(fresh, two_blocks("A1\nA2", "B\n")) == fresh


def test_refresh_refuses_a_missing_or_unregistered_block() -> None:
    with pytest.raises(ValueError, match="registered"):
        readme.refresh(TEXT, {"one": lambda: "A"})
    with pytest.raises(ValueError, match="registered"):
        readme.refresh(TEXT, {**two_blocks(), "three": lambda: "C"})
    unclosed = TEXT.replace("<!-- /generated:two -->\n", "")
    with pytest.raises(ValueError, match="registered"):
        readme.refresh(unclosed, two_blocks())


def test_check_fails_on_drift_and_generate_repairs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = README.read_text(encoding="utf-8")
    drifted = text.replace(REASONS[1].action.split(";")[0], "do something else", 1)
    assert drifted != text
    path = tmp_path / "README.md"
    path.write_text(drifted, encoding="utf-8")
    assert readme.update_readme(["--check", str(path)]) == 1
    assert "do something else" in capsys.readouterr().out
    assert path.read_text(encoding="utf-8") == drifted
    assert readme.update_readme([str(path)]) == 0
    assert path.read_text(encoding="utf-8") == text
    assert readme.update_readme(["--check", str(path)]) == 0
