"""A decode whose numSpeculativeTokens differs from the prefill's never serves.

The operator refuses to render such a pair (LookaheadMismatch). If a decode pod runs a different
k anyway (a hand-edited Deployment, a half-applied change), the engine image's launcher builds
vLLM's own config from the pod's args, finds a lookahead other than the one the operator put in
the pod's env, writes the reason to the termination-message file and exits 3, before vLLM starts:
no port is ever opened, so no request can reach it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

from fleet import Figures
from loopback import LOOPBACK
from processes import launcher_command, start_engine
from tier import render_pair
from wiring import EngineWiring

EXPECTED_REASON = (
    "pdmtp-engine refused to start: lookahead mismatch: operator expects 3, vLLM computes 2 "
    "(method=mtp k=2 mtp_modules=3); prefill backoff mismatch: operator expects 2, vLLM "
    "computes 1 (lookahead=2 state_backoff=0: no state layers)"
)


def test_the_operator_renders_no_pair_whose_ks_disagree(model: Path) -> None:
    try:
        render_pair(model, 3, decode_num_speculative_tokens=2)
    except AssertionError as refused:
        assert "LookaheadMismatch" in str(refused)
        assert "the prefill derives lookahead 3" in str(refused)
        assert "the decode derives 2" in str(refused)
    else:
        raise AssertionError("pdmtp render accepted prefill k=3 with decode k=2")


def test_the_launcher_refuses_a_decode_with_another_k_before_serving(
    wirings: Callable[[int], dict[str, EngineWiring]], workdir: Path, figures: Figures
) -> None:
    decode = wirings(3)["decode"]
    speculative = json.loads(decode.flag("--speculative-config"))
    assert speculative == {"method": "mtp", "num_speculative_tokens": 3}
    mismatched = decode.with_flag(
        "--speculative-config", json.dumps({**speculative, "num_speculative_tokens": 2})
    )
    engine = start_engine(
        "decode-k2-in-a-k3-pod",
        launcher_command(mismatched.args),
        mismatched.env,
        mismatched.url,
        workdir,
    )
    try:
        exit_code = engine.process.wait_exit(timeout=300)
    finally:
        engine.process.stop()
    log = engine.process.log()
    figures.notes["mismatch_refusal"] = {
        "exit_code": exit_code,
        "termination_message": engine.termination_message(),
        "seconds": round(engine.process.elapsed(), 1),
    }
    assert exit_code == 3, log
    assert engine.termination_message() == EXPECTED_REASON + "\n"
    assert EXPECTED_REASON in log
    assert "starting vLLM" not in log
    with socket.socket() as probe:
        assert probe.connect_ex((LOOPBACK, mismatched.http_port)) != 0
