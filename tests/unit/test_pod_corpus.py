"""docs/validation-corpus.md is the pod-field corpus's table (tests/cluster/pod_corpus.py), and
each row's offline verdict is what `pdmtp validate`'s check gives today."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster.pod_corpus import CASES, Case, doc, table
from pdmtp.core.validation import validate

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_table_is_generated() -> None:
    committed = (REPO / "docs" / "validation-corpus.md").read_text()
    assert committed == table(), "run: .venv/bin/python tests/cluster/pod_corpus.py > docs/..."


def test_the_corpus_holds_the_issues_cases() -> None:
    names = " ".join(c.name for c in CASES)
    issue = ("Near", "without maxSkew", '"root"', "no source", "two volumes", "does not", "0.5")
    for needle in issue:
        assert needle in names, needle


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_offline_verdict_matches_the_row(case: Case) -> None:
    verdict = validate(doc(case))
    if case.layer in ("schema", "CEL"):
        assert not verdict.usable
        assert case.words in verdict.message(), verdict.message()
    else:
        assert verdict.compatible, verdict.message()
