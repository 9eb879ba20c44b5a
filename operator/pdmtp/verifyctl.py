"""`pdmtp verify NAME`: the operator's verdict on each revision's P/D path, as a table.

It reads what the operator judged and wrote to the PDDeployment's status (`core.verification`),
not the engines themselves: the engines' metrics port is open only to the operator's pods
(their NetworkPolicy), and the verdict shown is the one the rollouts act on. The figures are the
evidence the verdict rests on: what the decodes counted while the operator watched them
(WINDOWS: the scrape windows with drafts that the acceptance test measures its variance over),
and each verdict's message gives the test's state (the acceptance against the reference's, the
log odds of a regression, and what fails or passes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pdmtp.api import reasons
from pdmtp.core.objects import metadata_of
from pdmtp.core.status.conditions import find, parse_conditions
from pdmtp.kube import Kube
from pdmtp.rolloutctl import get

EXIT_VERIFIED = 0
EXIT_FAILED = 1
EXIT_PENDING = 3
"""Not decided yet (too little traffic, or not scraped), or timed out waiting."""

_COLUMNS = (
    ("REVISION", "revision"),
    ("PHASE", "phase"),
    ("VERDICT", "verdict"),
    ("REASON", "reason"),
    ("DECODES", "decodePods"),
    ("REQUESTS", "requests"),
    ("KV PULLED", "pulledTokens"),
    ("RECOMPUTED", "recomputedTokens"),
    ("BACKOFF", "backoff"),
    ("FAILED", "failedPulls"),
    ("DECODE-ONLY", "decodeOnly"),
    ("DRAFTS", "drafts"),
    ("WINDOWS", "windows"),
    ("ACCEPTANCE", "acceptanceLength"),
)


def _row(revision: Mapping[str, Any]) -> dict[str, str]:
    judged = revision.get("verification") or {}
    cells = {
        "revision": revision.get("revision", ""),
        "phase": revision.get("phase", ""),
        **{key: judged.get(key) for _, key in _COLUMNS[2:]},
    }
    requests = judged.get("requests") or 0
    recomputed = judged.get("recomputedTokens") or 0
    expected = judged.get("expectedBackoff")
    # What the decodes recomputed per request, against what the lookahead says they should.
    per_request = f"{recomputed / requests:.2f}" if requests else "-"
    cells["backoff"] = f"{per_request}/{'-' if expected is None else expected}"
    acceptance = judged.get("acceptanceLength")
    cells["acceptanceLength"] = "-" if acceptance is None else f"{acceptance:.3f}"
    return {k: "-" if value is None else str(value) for k, value in cells.items()}


def table(status: Mapping[str, Any]) -> str:
    """One line per revision, with the message of each verdict below the table, then each
    role-local roll's verdict."""
    revisions: Sequence[Mapping[str, Any]] = status.get("revisions") or []
    rows = [_row(r) for r in revisions]
    header = [title for title, _ in _COLUMNS]
    lines = [header, *([row[key] for _, key in _COLUMNS] for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    ]
    for r in revisions:
        judged = r.get("verification")
        if judged:
            out.append(f"{r.get('revision')}: {judged.get('message', '')}")
    for roll in status.get("templateRolls") or []:
        out.append(
            f"{roll.get('revision')}, {roll.get('role')} template {roll.get('template')} "
            f"({roll.get('phase')}, from {roll.get('verifiedTemplate')}): {roll.get('message')}"
        )
    return "\n".join(out)


def outcome(obj: Mapping[str, Any]) -> tuple[int, str]:
    """The exit code and a line on the update revision's verdict (the Verified condition)."""
    status = obj.get("status") or {}
    conditions = parse_conditions(status.get("conditions") or [])
    verified = find(conditions, reasons.VERIFIED)
    current = status.get("observedGeneration") == metadata_of(obj).get("generation")
    if verified is None or not current:
        return EXIT_PENDING, "the operator has not judged this generation yet"
    line = f"Verified={verified.status} ({verified.reason}): {verified.message}"
    if verified.status == "True":
        return EXIT_VERIFIED, line
    if verified.status == "False":
        return EXIT_FAILED, line
    return EXIT_PENDING, line


def verify(
    kube: Kube,
    namespace: str,
    name: str,
    timeout: float,
    out: Callable[[str], None] = print,
    interval: float = 2.0,
) -> int:
    """Print the table; wait up to `timeout` seconds for the update revision to be decided."""
    deadline = time.monotonic() + timeout
    while True:
        obj = get(kube, namespace, name)
        code, line = outcome(obj)
        if code != EXIT_PENDING or time.monotonic() >= deadline:
            out(table(obj.get("status") or {}))
            out(line)
            return code
        time.sleep(interval)
