"""`pdmtp verify`'s reading of the status the operator wrote: the table, and the exit code from
the Verified condition of the generation it judged."""

from __future__ import annotations

from typing import Any

import pytest
from pdmtp.verifyctl import EXIT_FAILED, EXIT_PENDING, EXIT_VERIFIED, outcome, table

JUDGED = {
    "verdict": "Verified",
    "reason": "HandoffVerified",
    "message": "12 request(s) pulled KV with the backoff of 2, no failure",
    "decodePods": 2,
    "requests": 12,
    "pulledTokens": 1200,
    "recomputedTokens": 24,
    "expectedBackoff": 2,
    "failedPulls": 0,
    "decodeOnly": 0,
    "drafts": 100,
    "windows": 16,
    "acceptanceLength": 1.5,
}


def obj(status: str, reason: str, generation: int = 2, observed: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "status": {
            "observedGeneration": observed,
            "conditions": [
                {
                    "type": "Verified",
                    "status": status,
                    "reason": reason,
                    "message": "m",
                    "lastTransitionTime": "2027-01-15T08:00:00Z",
                }
            ],
            "revisions": [
                {"revision": "aaaa", "phase": "Serving", "verification": JUDGED},
                {"revision": "bbbb", "phase": "Starting"},
            ],
        },
    }


def test_the_table_shows_each_revisions_figures_and_the_backoff_per_request() -> None:
    lines = table(obj("True", "HandoffVerified")["status"]).splitlines()
    assert lines[0].split()[:4] == ["REVISION", "PHASE", "VERDICT", "REASON"]
    assert lines[1].split() == [
        "aaaa", "Serving", "Verified", "HandoffVerified", "2", "12", "1200", "24",
        "2.00/2", "0", "0", "100", "16", "1.500",
    ]  # fmt: skip
    assert lines[2].split()[:3] == ["bbbb", "Starting", "-"]
    assert lines[3] == f"aaaa: {JUDGED['message']}"


@pytest.mark.parametrize(
    ("status", "reason", "code"),
    [
        ("True", "HandoffVerified", EXIT_VERIFIED),
        ("False", "KVPullFailed", EXIT_FAILED),
        ("Unknown", "AwaitingRequests", EXIT_PENDING),
    ],
)
def test_the_exit_code_is_the_update_revisions_verdict(status: str, reason: str, code: int) -> None:
    got, line = outcome(obj(status, reason))
    assert got == code and line.startswith(f"Verified={status} ({reason})")


def test_a_generation_not_judged_yet_is_pending() -> None:
    assert outcome(obj("True", "HandoffVerified", generation=3))[0] == EXIT_PENDING
    assert outcome({"metadata": {}, "status": {}})[0] == EXIT_PENDING


def test_a_role_local_roll_is_listed_below_the_revisions() -> None:
    status = obj("False", "HandoffNotReported")["status"]
    status["templateRolls"] = [
        {"role": "decode", "revision": "aaaa", "template": "t2", "verifiedTemplate": "t1",
         "phase": "Failed", "startedAt": "2027-01-15T08:00:00Z", "reason": "HandoffNotReported",
         "message": "decode template t2 went back to template t1: no hand-off counts"},
    ]  # fmt: skip
    assert table(status).splitlines()[-1] == (
        "aaaa, decode template t2 (Failed, from t1): decode template t2 went back to template "
        "t1: no hand-off counts"
    )
    assert outcome(obj("False", "HandoffNotReported"))[0] == EXIT_FAILED
