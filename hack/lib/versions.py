"""The repository's pins, read from versions.env, the one file that writes them (hack/versions.sh
reads it for the shell scripts, with the same rules)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

VERSIONS_FILE: Final = Path(__file__).resolve().parents[2] / "versions.env"
_PIN: Final = re.compile(r"([A-Z][A-Z0-9_]*)=([A-Za-z0-9._+-]+)")
_SKIPPED: Final = re.compile(r"\s*(#.*)?")


def read_versions(
    path: Path = VERSIONS_FILE, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """Every KEY=value of `path`; PDMTP_<KEY> in `environ` overrides <KEY>."""
    pins: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if _SKIPPED.fullmatch(line):
            continue
        pin = _PIN.fullmatch(line)
        if pin is None or pin[1] in pins:
            raise ValueError(f"{path}:{number}: expected a new KEY=value, got {line!r}")
        pins[pin[1]] = environ.get(f"PDMTP_{pin[1]}") or pin[2]
    return pins
