"""The router tier's emulated vLLM engine.

It lives in images/engine-emulator/pdmtp_emulator/engine.py, because the same code is also the
engine of the kind e2e (the `localhost/pdmtp-engine-emulator` image); this module re-exports it
under the name the router tier has always imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

_PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "images" / "engine-emulator"
if str(_PACKAGE_ROOT) not in sys.path:
    sys.path.insert(0, str(_PACKAGE_ROOT))

from pdmtp_emulator.engine import (  # noqa: E402
    GENERATION_PATHS,
    LOOPBACK,
    MODEL,
    DecodeRecord,
    EngineEmulator,
    EngineFactory,
    FailMode,
    Failure,
    Identity,
    KVRecord,
    Recorded,
    Role,
)
from pdmtp_emulator.scheduler import Tuning  # noqa: E402

__all__ = [
    "GENERATION_PATHS",
    "LOOPBACK",
    "MODEL",
    "DecodeRecord",
    "EngineEmulator",
    "EngineFactory",
    "FailMode",
    "Failure",
    "Identity",
    "KVRecord",
    "Recorded",
    "Role",
    "Tuning",
]
