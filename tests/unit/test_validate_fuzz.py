"""`pdmtp validate` on 10,000 generated files (tests/support/specfuzz.py: valid specs mutated,
YAML and JSON scalar forms, bytes spliced in): never a traceback, the exit code always 0
(compatible), 1 (incompatible) or 2 (unusable), always with a message. Derandomized: the same
files on every run, so CI is reproducible; the time box is the example count
(PDMTP_FUZZ_EXAMPLES, default 10,000)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from pdmtp.cli import main
from specfuzz import Spec, specs

PDMTP = Path(sys.executable).parent / "pdmtp"
EXAMPLES = int(os.environ.get("PDMTP_FUZZ_EXAMPLES", "10000"))
seen: dict[int, int] = {}


def check(code: int, out: str, err: str, spec: Spec) -> None:
    assert "Traceback" not in out + err, spec.show()
    assert code in (0, 1, 2), f"exit {code}\n{out}{err}\n{spec.show()}"
    assert out.strip(), f"exit {code} with no message\n{err}\n{spec.show()}"
    if code == 1:
        assert "incompatible" in out, out
    seen[code] = seen.get(code, 0) + 1


def test_fuzz_validate_in_process(tmp_path: Path) -> None:
    path = tmp_path / "pdd.yaml"
    seen.clear()
    started = time.monotonic()

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(specs())
    def one(spec: Spec) -> None:
        path.write_bytes(spec.data)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["validate", str(path)])
            except Exception as e:  # a crash: the test's failure, with the file
                raise AssertionError(f"{type(e).__name__}: {e}\n{spec.show()}") from e
        check(code, out.getvalue(), err.getvalue(), spec)

    one()
    took = time.monotonic() - started
    total = sum(seen.values())
    print(f"fuzz: {total} files in {took:.1f} s, exit codes {dict(sorted(seen.items()))}")
    assert total >= EXAMPLES * 0.95  # hypothesis ran them all (a few may repeat)
    # Every verdict occurs: the generator reaches valid, incompatible and unusable specs.
    assert seen.get(0, 0) > EXAMPLES // 20 and seen.get(2, 0) > EXAMPLES // 20, seen
    assert seen.get(1, 0) > 0, seen


@pytest.mark.parametrize("index", range(4))
def test_fuzz_validate_as_a_subprocess(index: int, tmp_path: Path) -> None:
    """The installed command, on a few generated files (the first draws of a fixed stream)."""
    spec = _nth_spec(index)
    path = tmp_path / "pdd.yaml"
    path.write_bytes(spec.data)
    done = subprocess.run(
        [str(PDMTP), "validate", str(path)], capture_output=True, text=True, timeout=60
    )
    check(done.returncode, done.stdout, done.stderr, spec)


def _nth_spec(index: int) -> Spec:
    drawn: list[Spec] = []

    @settings(max_examples=index + 1, derandomize=True, database=None, deadline=None)
    @given(specs())
    def collect(spec: Spec) -> None:
        drawn.append(spec)

    collect()
    return drawn[-1]
