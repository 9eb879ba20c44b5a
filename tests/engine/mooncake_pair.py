"""Two Mooncake transfer engines over TCP on 127.0.0.1 move buffers between them.

Run by test_mooncake_transfer.py as `python mooncake_pair.py RESULT.json`, in a fresh network
namespace holding only loopback where the machine allows it: the transfer engine listens on
every address with no option to narrow it, and there it can only ever be reached over lo.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from mooncake.engine import TransferEngine

LOOPBACK = "127.0.0.1"
BUFFER_BYTES = 4 << 20


def start_engine() -> TransferEngine:
    engine = TransferEngine()
    # P2PHANDSHAKE: peers exchange segment metadata directly, no metadata server.
    status = engine.initialize(LOOPBACK, "P2PHANDSHAKE", "tcp", "")
    if status != 0:
        raise RuntimeError(f"TransferEngine.initialize returned {status}")
    return engine


def register(engine: TransferEngine, buffer: np.ndarray) -> None:
    status = engine.register_memory(buffer.ctypes.data, buffer.nbytes)
    if status != 0:
        raise RuntimeError(f"register_memory returned {status}")


def run() -> dict[str, Any]:
    sender, receiver = start_engine(), start_engine()
    receiver_address = f"{LOOPBACK}:{receiver.get_rpc_port()}"
    rng = np.random.default_rng(20261130)
    source = rng.integers(0, 256, BUFFER_BYTES, dtype=np.uint8)
    destination = np.zeros(BUFFER_BYTES, dtype=np.uint8)
    read_back = np.zeros(BUFFER_BYTES, dtype=np.uint8)
    for engine, buffer in ((sender, source), (receiver, destination), (sender, read_back)):
        register(engine, buffer)

    write_status = sender.transfer_sync_write(
        receiver_address, source.ctypes.data, destination.ctypes.data, BUFFER_BYTES
    )
    # Scattered blocks, as a KV transfer sends them: every other 64 KiB block, reversed order.
    block = 64 << 10
    offsets = list(range(0, BUFFER_BYTES, 2 * block))[::-1]
    read_status = sender.batch_transfer_sync_read(
        receiver_address,
        [read_back.ctypes.data + offset for offset in offsets],
        [destination.ctypes.data + offset for offset in offsets],
        [block] * len(offsets),
    )
    expected_read_back = np.zeros(BUFFER_BYTES, dtype=np.uint8)
    for offset in offsets:
        expected_read_back[offset : offset + block] = source[offset : offset + block]
    return {
        "receiver_address": receiver_address,
        "write_status": write_status,
        "written_intact": bool(np.array_equal(source, destination)),
        "read_status": read_status,
        "blocks_read": len(offsets),
        "read_back_exact": bool(np.array_equal(read_back, expected_read_back)),
        "bytes": BUFFER_BYTES,
    }


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(run()))
