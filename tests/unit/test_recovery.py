"""Issue 21's shell bounds: the PDDeployment reflector that waits for its CRD, the health it feeds,
and the executor that stops a step at its first refusal and writes replica counts only over the
version it observed."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from builders import pdd
from pdmtp.api.kinds import PDDEPLOYMENT
from pdmtp.cache import Reflector, Table
from pdmtp.controller import Controller, Options
from pdmtp.core.actions import Annotate, Apply, Delete, Scale, apply_if_drifted
from pdmtp.health import Watch, assess
from pdmtp.kube import ApiError
from pdmtp.metrics import Metrics
from test_shell import FakeApi, Response, Streamed, WatchResponse, kube

# ---- the PDDeployment table and its reflector -------------------------------------------------


def _pdd(name: str, rv: str, ns: str = "ns") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv}}


def test_the_table_keys_each_object_by_itself_and_a_relisting_drops_the_missing() -> None:
    table = Table()
    assert table.put("PDDeployment", _pdd("a", "5")) == ("ns", "a")
    assert table.put("PDDeployment", _pdd("a", "4")) == ("ns", "a")  # as the watch delivered it
    assert table.get(("ns", "a"))["metadata"]["resourceVersion"] == "4"  # type: ignore[index]
    table.put("PDDeployment", _pdd("b", "6", ns="other"))
    changed = table.replace("PDDeployment", "ns", [_pdd("c", "7")])
    assert changed == {("ns", "a"), ("ns", "c")}  # a gone, c new; b is in another scope
    assert sorted(table.snapshot()) == [("ns", "c"), ("other", "b")]
    assert table.replace("PDDeployment", None, [_pdd("c", "7")]) == {("other", "b")}
    assert table.drop("PDDeployment", "ns", "c") == ("ns", "c") and table.snapshot() == []


def test_a_pddeployment_reflector_lists_every_object_not_only_labelled_ones() -> None:
    listed = {"metadata": {"resourceVersion": "7"}, "items": [_pdd("a", "6")]}
    api = FakeApi([Response(200, listed), WatchResponse(200, response=Streamed([b""]))])
    table, notified = Table(), []
    reflector = Reflector(
        api,  # type: ignore[arg-type]
        PDDEPLOYMENT,
        "ns",
        table,
        notified.append,
        selector=None,
    )
    reflector._list_and_watch()
    assert api.calls[0]["url"] == "/apis/pdmtp.io/v1alpha1/namespaces/ns/pddeployments?"
    assert notified == [("ns", "a")] and reflector.watching


def test_an_unserved_resource_is_retried_with_a_short_pause_and_says_why() -> None:
    missing = Response(404, {"message": "the server could not find the requested resource"})
    listed = {"metadata": {"resourceVersion": "7"}, "items": []}
    hold = threading.Event()

    class Api(FakeApi):
        def call_api(self, method: str, url: str, header_params: Any, **kw: Any) -> Response:
            if len(self.calls) == 3:  # the watch after the third listing: stay open
                hold.wait(5)
            return super().call_api(method, url, header_params, **kw)

    api = Api(
        [missing, missing, Response(200, listed), WatchResponse(200, response=Streamed([b""]))]
    )
    reflector = Reflector(
        api,  # type: ignore[arg-type]
        PDDEPLOYMENT,
        None,
        Table(),
        lambda key: None,
        selector=None,
        max_backoff=0.05,
    )
    errors: list[str] = []
    started = time.monotonic()
    reflector.start()
    while not reflector.synced.is_set() and time.monotonic() - started < 5:
        if reflector.last_error:
            errors.append(reflector.last_error)
        time.sleep(0.005)
    reflector.stop()
    hold.set()
    assert reflector.synced.is_set(), "never listed after the resource appeared"
    assert time.monotonic() - started < 1.0, "the pause is bounded by max_backoff"
    assert errors and errors[0] == (
        "the API server does not serve pddeployments.pdmtp.io (is its CRD installed?)"
    )
    assert reflector.watching and reflector.last_error == ""


# ---- health -----------------------------------------------------------------------------------


def _watch(watching: bool, seconds: float, error: str = "") -> Watch:
    return Watch("pddeployments", "ns", watching, seconds, error)


@pytest.mark.parametrize(
    ("watches", "synced", "workers", "webhook", "uptime", "live", "ready"),
    [
        ([_watch(True, 50)], True, True, None, 50, True, True),
        ([_watch(True, 50)], True, True, True, 50, True, True),
        # Not watched: not ready at once, not live once the grace is over.
        ([_watch(False, 5, "no CRD")], True, True, None, 500, True, False),
        ([_watch(False, 120, "no CRD")], True, True, None, 500, False, False),
        ([_watch(True, 9), _watch(False, 121)], True, True, None, 500, False, False),
        # Children never synced, the webhook's resource never resolved: the same grace.
        ([_watch(True, 5)], False, True, None, 60, True, False),
        ([_watch(True, 5)], False, True, None, 121, False, False),
        ([_watch(True, 5)], True, True, False, 60, True, False),
        ([_watch(True, 5)], True, True, False, 121, False, False),
        # A dead worker is dead now; no reflector yet (start-up) is not ready.
        ([_watch(True, 5)], True, False, None, 5, False, False),
        ([], False, False, None, 1, False, False),
    ],
)
def test_health(
    watches: list[Watch],
    synced: bool,
    workers: bool,
    webhook: bool | None,
    uptime: float,
    live: bool,
    ready: bool,
) -> None:
    health = assess(watches, synced, workers, webhook, uptime, grace=120)
    assert (health.live, health.ready) == (live, ready), health.problems
    assert bool(health.problems) == (not ready)
    body = json.loads(health.body())
    assert body["live"] == live and body["watches"][0:1] == [{**w.__dict__} for w in watches[0:1]]


def test_the_problem_names_the_resource_and_the_error() -> None:
    health = assess([_watch(False, 7, "boom")], True, True, None, 7)
    assert health.problems == ("pddeployments in ns not watched for 7s: boom",)


def test_one_server_answers_health_and_metrics_on_every_address_it_listens_on() -> None:
    import asyncio
    import urllib.request

    from loopback import free_ports
    from pdmtp.endpoints import app, serve

    health_port, metrics_port = free_ports(2)
    metrics = Metrics()
    metrics.reconcile_errors.labels("ns", "pd").inc()

    def get(port: int, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    async def scenario() -> list[tuple[int, str]]:
        judge = lambda: assess([_watch(False, 7, "boom")], True, True, None, 7)  # noqa: E731
        listens = [("127.0.0.1", health_port), ("127.0.0.1", metrics_port)]
        runner = await serve(app(judge, metrics.exposition), listens)
        try:
            paths = [(health_port, "/healthz"), (health_port, "/readyz")]
            paths.append((metrics_port, "/metrics"))
            return [await asyncio.to_thread(get, port, path) for port, path in paths]
        finally:
            await runner.cleanup()

    (live, _), (ready, body), (scraped, exposition) = asyncio.run(scenario())
    assert (live, ready, scraped) == (200, 503, 200)
    assert "boom" in json.loads(body)["problems"][0]
    assert 'pdmtp_reconcile_errors_total{name="pd",namespace="ns"} 1.0' in exposition


# ---- executor bounds --------------------------------------------------------------------------


def test_an_apply_that_changes_replicas_is_conditional_on_the_observed_version() -> None:
    desired = {
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ns"},
        "spec": {"replicas": 3, "paused": False},
    }
    live = {**desired, "metadata": {**desired["metadata"], "resourceVersion": "41"}}
    other = {**live, "spec": {"replicas": 3, "paused": True}}
    fewer = {**live, "spec": {"replicas": 2, "paused": False}}
    assert apply_if_drifted(desired, {"Deployment/d": live}) is None
    assert apply_if_drifted(desired, {"Deployment/d": other}).resource_version is None  # type: ignore[union-attr]
    assert apply_if_drifted(desired, {"Deployment/d": fewer}).resource_version == "41"  # type: ignore[union-attr]
    assert apply_if_drifted(desired, {}).resource_version is None  # type: ignore[union-attr]


def test_a_conditional_write_sends_its_version_and_a_conflict_is_not_retried() -> None:
    conflict = Response(409, {"message": "the object has been modified"})
    k, api = kube(conflict)
    with pytest.raises(ApiError) as e:
        k.scale("ns", "d", 2, resource_version="41")
    assert e.value.status == 409 and len(api.calls) == 1
    assert api.calls[0]["body"] == {"metadata": {"resourceVersion": "41"}, "spec": {"replicas": 2}}

    k, api = kube(conflict)
    with pytest.raises(ApiError):
        k.apply({"kind": "Deployment", "metadata": {"name": "d", "namespace": "ns"}}, "41")
    assert len(api.calls) == 1 and api.calls[0]["body"]["metadata"]["resourceVersion"] == "41"

    k, api = kube(conflict, Response(200, {"kind": "Deployment"}))
    k.scale("ns", "d", 2)  # unconditional: a conflict is retried as before
    assert len(api.calls) == 2


class ScriptedKube:
    """Answers each write from a script: None accepts, an int refuses with that status."""

    def __init__(self, script: dict[str, int | None]) -> None:
        self.script = script
        self.sent: list[str] = []
        self.api = None

    def _answer(self, key: str) -> dict[str, Any]:
        self.sent.append(key)
        status = self.script.get(key)
        if status is not None:
            raise ApiError(status, "", json.dumps({"message": f"no to {key}"}))
        return {"metadata": {"name": key.split("/")[1], "namespace": "ns"}}

    def apply(self, manifest: dict[str, Any], resource_version: str | None = None) -> Any:
        return self._answer(f"{manifest['kind']}/{manifest['metadata']['name']}")

    def scale(self, ns: str, name: str, replicas: int, rv: str | None = None) -> Any:
        return self._answer(f"Deployment/{name}")

    def delete(self, kind: str, ns: str, name: str) -> None:
        self._answer(f"{kind}/{name}")

    def patch(self, kind: str, ns: str, name: str, body: Any, content_type: str) -> Any:
        return self._answer(f"{kind}/{name}")


ACTIONS = (
    Apply({"kind": "Service", "metadata": {"name": "svc", "namespace": "ns"}}, exists=True),
    Scale("old-prefill", 1, 2, resource_version="9"),
    Annotate("pod-1", {"pdmtp.io/leaving": "x"}, leaving=True),
    Delete("Deployment", "older-router"),
)


def _controller(script: dict[str, int | None]) -> tuple[Controller, ScriptedKube]:
    fake = ScriptedKube(script)
    return Controller(fake, Options(), Metrics()), fake  # type: ignore[arg-type]


def test_a_step_stops_at_its_first_refusal() -> None:
    controller, fake = _controller({"Deployment/old-prefill": 422})
    applied = controller.executor.apply(("ns", "pd"), ACTIONS)
    assert fake.sent == ["Service/svc", "Deployment/old-prefill"]
    assert [r.key for r in applied.refused] == ["Deployment/old-prefill"]
    assert applied.unapplied == ("Deployment/old-prefill", "Pod/pod-1", "Deployment/older-router")
    assert not applied.stale


def test_a_stale_conditional_write_stops_the_step_without_claiming_a_refusal() -> None:
    controller, fake = _controller({"Deployment/old-prefill": 409})
    applied = controller.executor.apply(("ns", "pd"), ACTIONS)
    assert fake.sent == ["Service/svc", "Deployment/old-prefill"]
    assert applied.stale and applied.refused == ()
    assert applied.unapplied[0] == "Deployment/old-prefill"
    assert controller.metrics.stale_writes._value.get() == 1


def test_an_unconditional_conflict_is_a_refusal() -> None:
    controller, _ = _controller({"Service/svc": 409})
    applied = controller.executor.apply(("ns", "pd"), ACTIONS)
    assert not applied.stale and [r.status for r in applied.refused] == [409]


def test_every_action_applied_when_none_is_refused() -> None:
    controller, fake = _controller({})
    applied = controller.executor.apply(("ns", "pd"), ACTIONS)
    assert len(fake.sent) == 4 and applied.refused == applied.unapplied == ()


def test_no_event_claims_an_action_that_was_never_sent() -> None:
    from pdmtp.core.context import Observed
    from pdmtp.core.reconcile import decide

    body = pdd("ev").dict() | {"metadata": {"name": "ev", "namespace": "ns", "generation": 1}}
    decision = decide(Observed(body), 1_000_000.0)
    keys = [a.key for a in decision.actions]
    assert len(keys) >= 3
    claimed = {e.message for e in decision.report().events}
    some = {e.message for e in decision.report(unapplied=keys[1:]).events}
    assert any(keys[0] in m for m in some)
    for key in keys[1:]:
        assert any(key in m for m in claimed) and not any(key in m for m in some)


def test_a_controller_starting_is_live_and_not_ready() -> None:
    controller, _ = _controller({})
    health = controller.health()
    assert health.live and not health.ready
    assert health.problems == ("child caches not synced after 0s",)


def test_one_backoff_doubles_up_to_its_cap_with_jitter() -> None:
    from pdmtp.backoff import backoff

    assert [backoff(n, 0.5, 8.0, rand=lambda: 0.0) for n in range(1, 6)] == [1, 2, 4, 8, 8]
    assert backoff(10, 0.5, 8.0, rand=lambda: 1.0) == 10.0  # at most a quarter more
    assert backoff(0, 0.2, jitter=1.0, rand=lambda: 1.0) == 0.4  # the API adapter's: uncapped
