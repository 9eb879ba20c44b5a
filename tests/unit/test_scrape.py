"""The scraper (`pdmtp.scrape`): which pods it reads, what it keeps between rounds, and the
directory source the KWOK cluster tier drives. No network: a fake source or files."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pdmtp.api import vocabulary as v
from pdmtp.cache import ChildStore, Table
from pdmtp.core.promtext import Scrape
from pdmtp.scrape import DirectorySource, HttpSource, Scraper, source_from

Obj = dict[str, Any]


def pod(name: str, role: str, terminating: bool = False) -> Obj:
    meta: Obj = {
        "name": name,
        "namespace": "ns",
        "resourceVersion": "1",
        "labels": {v.LABEL_NAME: "x", v.LABEL_ROLE: role},
    }
    if terminating:
        meta["deletionTimestamp"] = "2027-01-01T00:00:00Z"
    return {"kind": "Pod", "metadata": meta, "status": {"podIP": "192.0.2.1"}}


def pdd(autoscaling: Obj | None) -> Obj:
    spec: Obj = {} if autoscaling is None else {"autoscaling": autoscaling}
    return {"metadata": {"name": "x", "namespace": "ns", "resourceVersion": "1"}, "spec": spec}


@dataclass
class FakeSource:
    """Answers with a scrape at a given time per pod; None for a silent pod."""

    at: dict[str, float | None] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    def read(self, obj: Obj) -> Scrape | None:
        name = obj["metadata"]["name"]
        self.asked.append(name)
        at = self.at.get(name)
        return None if at is None else Scrape(at, running=at)


def scraper(source: FakeSource, autoscaling: Obj | None, pods: list[Obj]) -> Scraper:
    pdds, store = Table(), ChildStore()
    pdds.put("PDDeployment", pdd(autoscaling))
    for p in pods:
        store.put("Pod", p)
    return Scraper(source, pdds, store, lambda key: None)


def one_round(s: Scraper) -> None:
    asyncio.run(s._round(("ns", "x"), asyncio.Semaphore(4)))


def test_reads_live_engine_pods_only_and_keeps_the_two_latest_scrapes() -> None:
    source = FakeSource({"p-0": 10.0, "d-0": 10.0})
    pods = [pod("p-0", "prefill"), pod("d-0", "decode"), pod("r-0", "router")]
    pods.append(pod("d-1", "decode", terminating=True))
    s = scraper(source, {"intervalSeconds": 5}, pods)
    one_round(s)
    assert sorted(source.asked) == ["d-0", "p-0"]
    source.at = {"p-0": 15.0, "d-0": None}  # the decode goes silent
    one_round(s)
    seen = s.metrics("ns", "x")
    assert (seen["p-0"].latest.at, seen["p-0"].previous.at) == (15.0, 10.0)  # type: ignore[union-attr]
    # Silent: the last scrape is kept as it was, to age into staleness.
    assert (seen["d-0"].latest.at, seen["d-0"].previous) == (10.0, None)  # type: ignore[union-attr]
    source.at = {"p-0": 15.0}  # nothing new (a file not rewritten): no shift
    one_round(s)
    assert s.metrics("ns", "x")["p-0"].previous.at == 10.0  # type: ignore[union-attr]


def test_a_pod_gone_is_forgotten() -> None:
    source = FakeSource({"d-0": 1.0})
    s = scraper(source, {}, [pod("d-0", "decode")])
    one_round(s)
    s.store.drop("Pod", "ns", "d-0")
    one_round(s)
    assert s.metrics("ns", "x") == {}


def _run_until(s: Scraper, done: Callable[[], bool], seconds: float) -> None:
    """Run the scraper until `done` holds, or for `seconds` (a window in which nothing may
    happen, when `done` never holds)."""

    async def go() -> None:
        task = asyncio.create_task(s.run())
        deadline = time.monotonic() + seconds
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(go())


def _respec(s: Scraper, spec: Obj, version: str) -> None:
    body = pdd(None)
    s.pdds.put(
        "PDDeployment",
        {**body, "spec": spec, "metadata": {**body["metadata"], "resourceVersion": version}},
    )


def test_with_verification_off_only_autoscaled_pddeployments_are_scraped() -> None:
    source = FakeSource({"d-0": 1.0})
    s = scraper(source, None, [pod("d-0", "decode")])
    rounds: list[tuple[str, str]] = []
    s.on_scraped = rounds.append
    _respec(s, {"verification": {"mode": "Off"}}, "2")
    _run_until(s, lambda: False, 0.3)
    assert source.asked == [] and rounds == []
    _respec(s, {"verification": {"mode": "Off"}, "autoscaling": {"intervalSeconds": 1}}, "3")
    _run_until(s, lambda: bool(rounds), 10)
    assert source.asked == ["d-0"] and rounds == [("ns", "x")]


def test_verification_scrapes_every_pddeployment_and_queues_only_on_news() -> None:
    """Unset, spec.verification judges (mode Rollback): the pods are read every
    `verify_seconds`, and the PDDeployment is queued when a pod's numbers changed, not on
    every round (an autoscaled one is, its windows move with the clock)."""
    source = FakeSource({"d-0": 1.0})
    s = scraper(source, None, [pod("d-0", "decode")])
    s.verify_seconds = 0.05
    rounds: list[tuple[str, str]] = []
    s.on_scraped = rounds.append
    _run_until(s, lambda: len(source.asked) >= 3, 10)
    assert len(source.asked) >= 3
    assert rounds == [("ns", "x")], "queued again for numbers that did not change"
    source.at["d-0"] = 2.0
    _run_until(s, lambda: len(rounds) >= 2, 10)
    assert rounds == [("ns", "x")] * 2


def test_the_directory_source_reads_a_pods_file_at_its_modification_time(tmp_path: Path) -> None:
    (tmp_path / "ns").mkdir()
    path = tmp_path / "ns" / "d-0.prom"
    path.write_text('vllm:num_requests_running{model_name="m"} 3\n')
    os.utime(path, (1000.0, 1000.0))
    scrape = DirectorySource(tmp_path).read(pod("d-0", "decode"))
    assert scrape is not None and (scrape.at, scrape.running) == (1000.0, 3.0)
    assert DirectorySource(tmp_path).read(pod("d-1", "decode")) is None


def test_metrics_source_flag() -> None:
    assert isinstance(source_from(None), HttpSource)
    assert source_from(None).port == v.ENGINE_METRICS_PORT  # type: ignore[attr-defined]
    assert isinstance(source_from("dir:/tmp/m"), DirectorySource)
    with pytest.raises(ValueError, match="http or dir:PATH"):
        source_from("file:/tmp")


def test_http_source_gives_nothing_for_a_pod_without_an_ip() -> None:
    bare = pod("d-0", "decode")
    bare["status"] = {}
    assert HttpSource().read(bare) is None
