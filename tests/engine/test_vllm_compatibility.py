"""The connector refuses to load against a vLLM whose private members moved or changed shape."""

from __future__ import annotations

from typing import Any

import pytest
from pdmtp_engine.connector import IncompatibleVllmError, check_vllm_compatibility
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector import (
    MooncakeConnectorScheduler,
)
from vllm.v1.request import Request


def test_the_pinned_vllm_has_everything_the_connector_relies_on() -> None:
    check_vllm_compatibility()


def test_missing_token_count_hook_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(MooncakeConnectorScheduler, "_get_remote_prefill_token_count")
    with pytest.raises(IncompatibleVllmError, match="_get_remote_prefill_token_count"):
        check_vllm_compatibility()


def test_changed_token_count_signature_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def renamed_parameter(self: Any, request: Request) -> int:
        return 0

    monkeypatch.setattr(
        MooncakeConnectorScheduler, "_get_remote_prefill_token_count", renamed_parameter
    )
    with pytest.raises(IncompatibleVllmError, match="num_prompt_tokens"):
        check_vllm_compatibility()


def test_on_new_request_doing_more_than_truncation_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def on_new_request_with_heartbeats(self: Any, request: Request) -> None:
        self._truncate_mamba_request_for_prefill(request)
        self.track_heartbeat(request)

    monkeypatch.setattr(
        MooncakeConnectorScheduler, "on_new_request", on_new_request_with_heartbeats
    )
    with pytest.raises(IncompatibleVllmError, match="track_heartbeat"):
        check_vllm_compatibility()


def test_missing_lookahead_property_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(VllmConfig, "num_prefill_lookahead_tokens")
    with pytest.raises(IncompatibleVllmError, match="num_prefill_lookahead_tokens"):
        check_vllm_compatibility()
