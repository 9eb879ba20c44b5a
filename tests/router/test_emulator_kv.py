"""The emulator's KV transfer stand-in, driven by the real vllm-router on loopback.

The kind e2e's "0 cross-revision requests" rests on it: a decode must end up with the KV of the
prefill the router paired it with (found through that prefill's bootstrap `/query` and engine id,
as vLLM's Mooncake decoder does), and must fail loudly when the router's params cannot be
honoured. These tests show both with the router the operator deploys.
"""

from __future__ import annotations

import json

from router.emulator import EngineFactory, Identity
from router.harness import RouterFactory, completion_body, post


def provenance(reply_json: dict[str, object]) -> dict[str, dict[str, object]]:
    choices = reply_json["choices"]
    assert isinstance(choices, list)
    kv: dict[str, dict[str, object]] = json.loads(choices[0]["text"])["kv"]
    return kv


def test_each_decode_uses_the_kv_of_the_prefill_the_router_paired_it_with(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    prefills = [
        engine(
            "prefill", f"p{i}", identity=Identity(pod=f"p{i}", revision="r1", speculative_tokens=3)
        )
        for i in range(2)
    ]
    d = engine("decode", "d0", identity=Identity("d0", "r1", 3), pull_kv=True)
    router = start_router(prefills, [d])

    used = []
    for _ in range(6):
        reply = post(router.base, "/v1/completions", completion_body())
        assert reply.status == 200, reply.body
        used.append(provenance(reply.json())["prefill"]["pod"])

    # round_robin alternates the prefills; every decode pulled from the one it was paired with.
    assert sorted(set(used)) == ["p0", "p1"]
    assert [r.prefill.pod for r in d.decodes] == used
    for record, prefill_request in zip(
        d.decodes,
        sorted((r for p in prefills for r in p.generation_requests()), key=lambda r: r.at),
        strict=True,
    ):
        assert record.transfer_id == prefill_request.body["kv_transfer_params"]["transfer_id"]
        assert record.same_revision


def test_a_decode_reports_the_prefills_revision_when_it_differs(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    # What a router pairing across revisions would produce: the client can tell.
    p = engine("prefill", "p", identity=Identity("p", "old", 3))
    d = engine("decode", "d", identity=Identity("d", "new", 2), pull_kv=True)
    router = start_router([p], [d])
    reply = post(router.base, "/v1/completions", completion_body())
    assert reply.status == 200, reply.body
    kv = provenance(reply.json())
    assert (kv["decode"]["revision"], kv["prefill"]["revision"]) == ("new", "old")
    assert (kv["decode"]["speculative_tokens"], kv["prefill"]["speculative_tokens"]) == (2, 3)
    assert not d.decodes[0].same_revision


def test_a_stale_engine_id_fails_the_decode_instead_of_passing_silently(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    p = engine("prefill", "p", identity=Identity("p", "r1", 3))
    d = engine("decode", "d", identity=Identity("d", "r1", 3), pull_kv=True)
    router = start_router([p], [d])
    p.restart()  # new engine id; the router keeps sending the old one (docs/router.md)
    router.wait_all_healthy()  # its 1 s health probe may have caught the restart
    reply = post(router.base, "/v1/completions", completion_body())
    assert reply.status == 500
    assert "serves no engine" in reply.body.decode()
    assert not d.decodes
