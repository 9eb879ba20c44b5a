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


def test_the_corpus_holds_a_row_per_class_of_issue_29() -> None:
    names = " ".join(c.name for c in CASES)
    classes = (
        "targets given but empty",
        "kvCacheUsage target as a percent",
        "above the decode role's own k",
        "on the prefill role",
        "without spec.speculative",
        "staleAfterSeconds 20 below intervalSeconds",
        "a band reached exactly",
        "engine requests above limits",
        "router requests above limits",
        "a GPU on the router",
        "8Ei of memory",
        "//models",
        "/cache/../models",
        "a mount at / ",
        "weights volume with no pvc or image source",
        "image source's subPath",
        "final newline",
        "--api-key",
        "--hf-token",
        "canary with maxSurge 0 on one-pod roles",
    )
    for needle in classes:
        assert needle in names + " ", needle


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_offline_verdict_matches_the_row(case: Case) -> None:
    verdict = validate(doc(case))
    if case.layer in ("schema", "CEL", "rule"):
        assert not verdict.usable
        assert case.words in verdict.message(), verdict.message()
    else:
        assert verdict.compatible, verdict.message()
