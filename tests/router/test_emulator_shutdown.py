"""The emulator stops as vLLM does with `--shutdown-timeout`: told to stop, it refuses new
connections and finishes the requests it holds, for up to that long; a request that needs longer
is dropped."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

import pytest
from router.emulator import EngineEmulator
from router.harness import completion_body, post


def _in_flight(emu: EngineEmulator) -> tuple[threading.Thread, dict[str, object]]:
    result: dict[str, object] = {}

    def send() -> None:
        try:
            result["status"] = post(emu.url, "/v1/completions", completion_body()).status
        except (OSError, urllib.error.URLError) as e:
            result["error"] = e

    thread = threading.Thread(target=send)
    thread.start()
    deadline = time.monotonic() + 5
    while not emu.generation_requests() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert emu.generation_requests(), "the request never arrived"
    return thread, result


@pytest.mark.parametrize(("timeout", "answered"), [(5.0, True), (0.5, False)])
def test_stopping_finishes_what_it_holds_within_the_shutdown_timeout(
    timeout: float, answered: bool
) -> None:
    emu = EngineEmulator("decode", "d0", shutdown_timeout=timeout).start()
    emu.fail("slow", delay=2.0)
    url = emu.url
    thread, result = _in_flight(emu)
    emu.stop()
    thread.join(timeout=10)
    assert (result.get("status") == 200) is answered, result
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/health", timeout=2)
