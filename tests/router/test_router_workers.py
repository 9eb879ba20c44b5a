"""Run-time worker membership through vllm-router 0.1.17's admin API, in Mooncake P/D mode.

Why the operator rolls the router Deployment on every membership change instead of calling the
worker routes the router inherits from the SGLang router (docs/router.md, "Decision"). Every
router here is started with `static_router_args` (`--vllm-pd-disaggregation --kv-connector
mooncake --prefill URL PORT --decode URL`) against emulated engines on 127.0.0.1.

What 0.1.17 does, as these tests pin it (source: `src/server.rs` for the routes,
`src/routers/http/vllm_pd_router.rs` and `pd_router.rs` for what they do in P/D mode,
`src/routers/router_manager.rs` for `--enable-igw`):

- Adding is refused. `POST /add_worker?url=` and `POST /workers` (JSON `{url, worker_type,
  bootstrap_port}`) both call the P/D router's `add_worker`, which always answers 400 "PD router
  requires specific add_prefill_server or add_decode_server methods"; those two names are not
  HTTP routes (an unknown POST is forwarded to the engines as an inference request). No new
  engine is ever called, and no bootstrap `/query` is asked.
- Removing works and is immediate for new requests: `POST /remove_worker?url=` and
  `DELETE /workers/{url-encoded url}` take the worker out of the registry; the next request
  never picks it, the health checker stops probing it, and nothing can bring it back short of
  a router restart. Both answer 200 for any url, known or not (exact string match, no
  normalisation), so a 200 proves nothing. A request already routed to it (the pair is picked
  before the prefill is called) still reaches it, and the decode still gets the removed
  prefill's engine id: the Mooncake id table is never pruned.
- `/readiness` counts what is left: 503 with the role's reason once a role has no worker.
- `--enable-igw` is the one mode where `POST /workers` adds prefills and decodes, but it ignores
  the static `--prefill/--decode` lists, never asks a prefill's `/query` (decode requests carry
  no `kv_transfer_params` at all: silently not disaggregated), and its `/readiness` says "Ready"
  with no decode at all.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pdmtp.core.render.router import ROUTER_READINESS_PATH
from router.emulator import MODEL, EngineEmulator, EngineFactory, Role
from router.harness import Reply, RouterFactory, completion_body, post

ADD_REFUSED = "PD router requires specific add_prefill_server or add_decode_server methods"
"""The body of every run-time add in P/D mode (`PdRouterBase::add_worker`)."""

UNKNOWN = "http://127.0.0.1:9"
"""A worker URL the router never heard of (never dialled: the router only looks it up)."""


def call(base: str, method: str, path: str, body: Mapping[str, Any] | None = None) -> Reply:
    """One admin request: JSON body if given, none otherwise; HTTP errors are returned."""
    req = urllib.request.Request(
        base + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={} if body is None else {"Content-Type": "application/json"},
        method=method,
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return Reply(r.status, r.read())
    except urllib.error.HTTPError as e:
        return Reply(e.code, e.read())


def quoted(url: str) -> str:
    return urllib.parse.quote(url, safe="")


def remove(base: str, url: str, route: str) -> Reply:
    """Remove `url` through the legacy route or the RESTful one."""
    if route == "remove_worker":
        return call(base, "POST", f"/remove_worker?url={quoted(url)}")
    return call(base, "DELETE", f"/workers/{quoted(url)}")


def listed(base: str) -> set[str]:
    reply = call(base, "GET", "/list_workers")
    assert reply.status == 200, reply
    return set(reply.json()["urls"])


def readiness(base: str) -> Reply:
    return call(base, "GET", ROUTER_READINESS_PATH)


def complete(base: str, n: int) -> None:
    for _ in range(n):
        reply = post(base, "/v1/completions", completion_body())
        assert reply.status == 200, reply


def decode_params(*decodes: EngineEmulator) -> list[dict[str, Any]]:
    return [r.body.get("kv_transfer_params") for d in decodes for r in d.generation_requests()]


def probes(emu: EngineEmulator) -> int:
    return sum(r.path == "/health" for r in emu.requests)


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_admin_routes_list_the_static_workers(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    p = engine("prefill", "p0")
    d = engine("decode", "d0")
    base = start_router([p], [d]).base

    assert listed(base) == {p.url, d.url}
    workers = call(base, "GET", "/workers").json()
    by_url = {w["url"]: w for w in workers["workers"]}
    assert by_url[p.url]["worker_type"] == "prefill"
    assert by_url[p.url]["bootstrap_port"] == p.bootstrap_port
    assert by_url[d.url]["worker_type"] == "decode"
    assert workers["stats"] == {"prefill_count": 1, "decode_count": 1, "regular_count": 0}
    assert call(base, "GET", f"/workers/{quoted(d.url)}").json()["url"] == d.url
    unknown = call(base, "GET", f"/workers/{quoted(UNKNOWN)}")
    assert (unknown.status, unknown.json()["code"]) == (404, "WORKER_NOT_FOUND")
    # The legacy add/remove routes are POST only.
    assert call(base, "GET", f"/add_worker?url={quoted(d.url)}").status == 405
    assert call(base, "GET", f"/remove_worker?url={quoted(d.url)}").status == 405


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_adding_a_worker_at_run_time_is_refused(
    engine: EngineFactory, start_router: RouterFactory, role: Role
) -> None:
    p = engine("prefill", "p0")
    d = engine("decode", "d0")
    base = start_router([p], [d]).base
    new = engine(role, "new")
    spec: dict[str, Any] = {"url": new.url, "worker_type": role}
    if role == "prefill":
        spec["bootstrap_port"] = new.bootstrap_port

    legacy = call(base, "POST", f"/add_worker?url={quoted(new.url)}")
    assert (legacy.status, legacy.body.decode()) == (400, ADD_REFUSED)
    rest = call(base, "POST", "/workers", spec)
    assert rest.status == 400
    assert rest.json() == {"error": ADD_REFUSED, "code": "ADD_WORKER_FAILED"}
    # The two names in the message are no routes: an unknown POST goes down the P/D pipeline
    # to a prefill as an inference request (whose 404 comes back), never adding anything.
    named = post(base, f"/add_{role}_server?url={quoted(new.url)}", {"url": new.url})
    assert named.status == 404
    assert [r.path for r in p.requests if r.method == "POST"] == [f"/add_{role}_server"]

    assert listed(base) == {p.url, d.url}
    complete(base, 4)
    assert new.requests == []  # never probed, never routed to
    assert new.bootstrap_queries == 0
    assert len(p.generation_requests()) == len(d.generation_requests()) == 4


@pytest.mark.parametrize("route", ["remove_worker", "delete"])
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_removing_a_worker_stops_new_traffic_to_it_at_once(
    engine: EngineFactory, start_router: RouterFactory, role: Role, route: str
) -> None:
    prefills = [engine("prefill", f"p{i}") for i in range(2 if role == "prefill" else 1)]
    decodes = [engine("decode", f"d{i}") for i in range(2 if role == "decode" else 1)]
    base = start_router(prefills, decodes).base
    victim, *rest = prefills if role == "prefill" else decodes

    reply = remove(base, victim.url, route)
    assert reply.status == 200, reply
    if route == "remove_worker":
        assert reply.body.decode() == f"Successfully removed worker: {victim.url}"
    else:
        assert reply.json()["success"] is True
    assert victim.url not in listed(base)
    ready = readiness(base)
    assert ready.status == 200
    assert ready.json()[role] == {"healthy": 1, "total": 1}

    complete(base, 6)  # round robin would have sent the victim 3 of them
    assert victim.generation_requests() == []
    assert len(rest[0].generation_requests()) == 6
    survivor = prefills[-1]
    for params in decode_params(*decodes):
        assert params["remote_engine_id"] == survivor.engine_id
        assert params["remote_bootstrap_addr"] == survivor.bootstrap_addr


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_removing_the_last_worker_of_a_role_makes_the_router_not_ready_for_good(
    engine: EngineFactory, start_router: RouterFactory, role: Role
) -> None:
    p = engine("prefill", "p0")
    d = engine("decode", "d0")
    base = start_router([p], [d]).base
    victim = p if role == "prefill" else d

    assert remove(base, victim.url, "remove_worker").status == 200
    at_removal = probes(victim)

    ready = readiness(base)
    assert ready.status == 503
    assert ready.json()["status"] == "not_ready"
    assert ready.json()["reason"] == f"no healthy {role} workers"
    assert ready.json()[role] == {"healthy": 0, "total": 0}
    reply = post(base, "/v1/completions", completion_body())
    left = "0 prefill, 1 decode" if role == "prefill" else "1 prefill, 0 decode"
    assert (reply.status, reply.body.decode()) == (503, f"No available workers: {left}")

    # The engine is still up and healthy, but the 1 s health checker only walks the registry:
    # at most a probe already under way at the removal, then none; it never comes back.
    time.sleep(1.2)
    settled = probes(victim)
    assert settled - at_removal <= 1
    time.sleep(1.2)
    assert probes(victim) == settled
    assert readiness(base).status == 503
    assert victim.url not in listed(base)


def test_removal_answers_200_for_any_url(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    p = engine("prefill", "p0")
    d = engine("decode", "d0")
    base = start_router([p], [d]).base

    for url in (UNKNOWN, d.url + "/"):  # exact string match: a trailing slash misses
        legacy = remove(base, url, "remove_worker")
        assert (legacy.status, legacy.body.decode()) == (200, f"Successfully removed worker: {url}")
        rest = remove(base, url, "delete")
        assert rest.status == 200
        assert rest.json() == {"success": True, "message": f"Worker {url} removed successfully"}
    assert listed(base) == {p.url, d.url}
    assert call(base, "POST", "/remove_worker").status == 400  # `url` is required


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_request_already_routed_still_reaches_a_removed_worker(
    engine: EngineFactory, start_router: RouterFactory, role: Role
) -> None:
    """The pair is picked before the prefill is called; removal changes only later picks."""
    p = engine("prefill", "p0")
    d = engine("decode", "d0")
    base = start_router([p], [d]).base
    p.fail("slow", delay=0.8)  # hold the request at the prefill stage

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, base, "/v1/completions", completion_body())
        wait_for(lambda: len(p.generation_requests()) == 1)
        assert remove(base, (p if role == "prefill" else d).url, "delete").status == 200
        removed_at = time.monotonic()
        reply = pending.result(timeout=10)

    assert reply.status == 200, reply
    assert reply.json()["choices"][0]["text"] == d.output_text()
    (d_req,) = d.generation_requests()
    assert d_req.at > removed_at  # the decode was called after its removal (or its prefill's)
    params = d_req.body["kv_transfer_params"]
    # Even for a removed prefill: its engine id stays in the router's Mooncake table.
    assert params["remote_engine_id"] == p.engine_id
    assert params["remote_bootstrap_addr"] == p.bootstrap_addr
    assert readiness(base).status == 503  # and the next request has nowhere to go


def test_igw_mode_adds_pd_workers_but_never_learns_their_engine_ids(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    """`--enable-igw` (RouterManager) is the only 0.1.17 mode whose `POST /workers` adds P/D
    workers; it has the same hole as Kubernetes discovery (test_router_discovery.py)."""
    p0 = engine("prefill", "p0")
    d0 = engine("decode", "d0")
    router = start_router([p0], [d0], extra_args=["--enable-igw"])
    base = router.base

    # The static lists are ignored: no worker, no /query, and Ready anyway.
    assert call(base, "GET", "/workers").json()["total"] == 0
    assert p0.bootstrap_queries == 0
    assert (readiness(base).status, readiness(base).body) == (200, b"Ready")

    p1 = engine("prefill", "p1")
    d1 = engine("decode", "d1")
    for spec in (
        {"url": d1.url, "worker_type": "decode"},
        {"url": p1.url, "worker_type": "prefill", "bootstrap_port": p1.bootstrap_port},
    ):
        added = call(base, "POST", "/workers", spec)
        assert added.status == 200, added
        worker = added.json()["worker"]
        assert (worker["worker_type"], worker["model_id"]) == (spec["worker_type"], MODEL)

    complete(base, 4)
    assert len(p1.generation_requests()) == len(d1.generation_requests()) == 4
    assert p0.generation_requests() == d0.generation_requests() == []
    assert p1.bootstrap_queries == 0  # never asked: the decode learns no engine id
    assert all("kv_transfer_params" not in r.body for r in d1.generation_requests())
    for r in p1.generation_requests():
        assert r.body["kv_transfer_params"]["do_remote_decode"] is True

    assert call(base, "DELETE", f"/workers/{quoted(d1.url)}").status == 200
    assert (readiness(base).status, readiness(base).body) == (200, b"Ready")  # no decode left
    reply = post(base, "/v1/completions", completion_body())
    assert (reply.status, reply.body) == (503, b"No available workers: 1 prefill, 0 decode")
