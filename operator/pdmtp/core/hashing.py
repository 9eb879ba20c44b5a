"""Canonical JSON and the short hashes made from it: revisions, applied-manifest stamps, router
membership tokens. One serialisation, so the same data always gives the same hash."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(data: Any) -> str:
    """Sorted keys, no whitespace: the form every hash and every JSON flag is made from."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def short_hash(data: Any, length: int) -> str:
    """The first `length` hex digits of the SHA-256 of `data` (a string is hashed as it is)."""
    text = data if isinstance(data, str) else canonical_json(data)
    return hashlib.sha256(text.encode()).hexdigest()[:length]
