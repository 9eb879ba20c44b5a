"""The fixed pair: greedy output identical to one engine, the backoff split per request, and MTP
acceptance identical to one engine's.

For numSpeculativeTokens k in {2, 3} with a 3-module MTP checkpoint vLLM's lookahead is k, so
the backoff is k - 1: the prefill must compute N - (k - 1) prompt tokens. The decode pulls the
KV of all but the last `refresh` of those (connector.drafter_refresh: k) and recomputes the
backoff and the refresh itself.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fleet import Completion, drafting_of
from runs import PairRun


@pytest.fixture(scope="module", params=[2, 3], ids=lambda k: f"k{k}")
def pair_run(request: pytest.FixtureRequest, fixed_pair: Callable[[int], PairRun]) -> PairRun:
    return fixed_pair(request.param)


def test_the_launcher_verified_the_rendered_config_and_started_vllm(pair_run: PairRun) -> None:
    k, backoff = pair_run.k, pair_run.backoff
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        assert pair_run.wiring[role].env["PDMTP_EXPECTED_LOOKAHEAD"] == str(k)
        assert pair_run.wiring[role].env["PDMTP_EXPECTED_PREFILL_BACKOFF"] == str(backoff)
        assert pair_run.launcher_lines[role] == [
            f"pdmtp-engine: method=mtp k={k} mtp_modules=3, lookahead={k}, "
            f"prefill_backoff={backoff}, kv_role={kv_role}: starting vLLM"
        ]


def test_greedy_outputs_are_identical_to_one_engine(
    pair_run: PairRun, reference: dict[str, Completion]
) -> None:
    differing = {}
    for one in pair_run.served:
        got, want = one.completion, reference[one.prompt.name]
        assert got.status == 200, f"{one.prompt.name}: {got.error}"
        assert got.token_ids is not None, "the router dropped return_token_ids"
        if got.token_ids != want.token_ids:
            differing[one.prompt.name] = (got.token_ids, want.token_ids)
    assert differing == {}


def test_prefill_computes_all_but_the_backoff_and_decode_recomputes_it_and_the_refresh(
    pair_run: PairRun,
) -> None:
    backoff, recomputed = pair_run.backoff, pair_run.backoff + pair_run.refresh
    for one in pair_run.served:
        n = len(one.prompt.token_ids)
        assert one.accounting is not None
        assert dict(one.accounting.prefill) == {
            "local_compute": n - backoff,
            "local_cache_hit": 0,
            "external_kv_transfer": 0,
        }, one.prompt.name
        assert dict(one.accounting.decode) == {
            "local_compute": recomputed,
            "local_cache_hit": 0,
            "external_kv_transfer": n - recomputed,
        }, one.prompt.name


def test_every_request_pushed_its_kv_over_mooncake(pair_run: PairRun) -> None:
    assert len(pair_run.transfers_ms) == len(pair_run.served)


def test_the_decode_exports_the_hand_off_it_made(pair_run: PairRun) -> None:
    """The connector's counters agree with the per-request accounting above: every request
    pulled N - backoff - refresh tokens and recomputed the backoff (what the verdict holds to
    the derived backoff) and the refresh, none fell back to decode-only, no receive failed;
    and the decode drafted (vLLM's spec-decode counters)."""
    prompt_lens = [len(one.prompt.token_ids) for one in pair_run.served]
    handoff = pair_run.handoff
    requests = len(prompt_lens)
    assert handoff["pdmtp:kv_pulled_requests_total"] == requests, handoff
    assert handoff["pdmtp:kv_pulled_tokens_total"] == sum(prompt_lens) - requests * (
        pair_run.backoff + pair_run.refresh
    ), handoff
    assert handoff["pdmtp:kv_backoff_tokens_total"] == requests * pair_run.backoff
    assert handoff["pdmtp:kv_refreshed_tokens_total"] == requests * pair_run.refresh
    assert handoff["pdmtp:kv_decode_only_requests_total"] == 0, handoff
    assert handoff.get("vllm:mooncake_num_failed_recvs_total", 0) == 0, handoff
    assert handoff["vllm:spec_decode_num_drafts_total"] > 0, handoff
    assert (
        0
        <= handoff["vllm:spec_decode_num_accepted_tokens_total"]
        <= (handoff["vllm:spec_decode_num_draft_tokens_total"])
    ), handoff


def test_one_engine_accepts_every_draft_at_every_position(pair_run: PairRun) -> None:
    """The checkpoint's claim, on vLLM itself: one engine (the fixed prefill, asked directly)
    accepts every draft token, at each of the k draft positions."""
    one = drafting_of(pair_run.one_engine)
    assert one.drafts > 0
    assert one.accepted == one.draft_tokens, one
    assert len(one.accepted_per_position) == pair_run.k
    assert one.accepted_per_position[0] == one.drafts, one
    assert sum(one.accepted_per_position) == one.accepted, one


def test_the_pair_accepts_exactly_what_one_engine_accepts(pair_run: PairRun) -> None:
    """Request by request (prompts of the same lengths), the same draft rounds and the same
    tokens accepted at each position: nothing lost in the hand-off. Before the drafter refresh
    each request lost its first round (k=3: the draft read the prefill's own sampled token at
    2 back; k=2: the second draft did, and a one-token recompute padded a round)."""
    one_engine = {s.prompt.name: s.drafting for s in pair_run.one_engine}
    pair = {s.prompt.name: s.drafting for s in pair_run.served}
    assert pair == one_engine
