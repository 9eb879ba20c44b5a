"""vLLM's Mooncake P/D connector with the multi-module MTP prefill backoff, and a decode that
rebuilds the drafter KV the prefill could not get right.

vLLM's `MooncakeConnector` backs off only the one token that hybrid Mamba and bounded-replay
models need. This subclass makes the prefill stop `backoff = max(state_backoff, lookahead - 1)`
tokens short of the prompt, the rule vLLM's NIXL connector applies (`_prefill_backoff` in its
scheduler), so the operator's derived backoff holds on both sides.

The backoff alone leaves the drafter's KV wrong at the end of what the prefill computed
(docs/design.md, "MTP acceptance through the hand-off"): the prefill's drafter builds its entries
at the last `lookahead` positions from tokens past its truncated prompt (its own sampled token,
and with several MTP modules its drafts) instead of the prompt's next tokens, and the decode
never rewrites them. And a decode that recomputes exactly one prompt token is padded by vLLM's
scheduler with placeholder drafts that it counts as a draft round with nothing accepted. So the
decode also recomputes `drafter_refresh` tokens the prefill did compute, and the prefill sends
only the blocks the decode pulls:

- prefill (kv_producer) drops the trailing `backoff` prompt tokens before the prefix-cache
  lookup, once, and ships the blocks holding the first `prompt_len - backoff - refresh` tokens;
- decode (kv_consumer) pulls those tokens and recomputes the last `backoff + refresh`.

The decode's scheduler half also counts the hand-off (requests and tokens pulled, tokens
recomputed for the backoff and for the refresh, decode-only requests) into vLLM's connector
stats, which vLLM's API server exports (`pdmtp_engine.handoff`).

Load it with `--kv-transfer-config '{"kv_connector": "BackoffMooncakeConnector",
"kv_connector_module_path": "pdmtp_engine.connector", ...}'`. The worker side is vLLM's own.

It overrides private members of the pinned vLLM, so importing this module checks that they are
still there with the shape relied on, and refuses to load otherwise.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector import (
    MooncakeConnector,
    MooncakeConnectorScheduler,
    MooncakeConnectorWorker,
)
from vllm.v1.kv_cache_interface import AttentionSpec
from vllm.v1.request import Request

from pdmtp_engine.handoff import HandoffPromMetrics, HandoffStats

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig

REMOTE_PREFILL_KEYS: Final = ("remote_engine_id", "remote_bootstrap_addr", "transfer_id")
"""The kv_transfer_params a decode needs to pull; without them vLLM computes the prompt itself."""

TRUNCATED_MARKER: Final = "_p_side_truncated"
"""kv_transfer_params key marking a prefill request already truncated. It is the key vLLM's
own Mamba truncation uses, so neither path can truncate a request the other already did."""


class IncompatibleVllmError(ImportError):
    """The installed vLLM lacks a private member this connector overrides or relies on."""


def prefill_backoff(lookahead: int, state_backoff: int) -> int:
    """Trailing prompt tokens the prefiller must not compute; the decoder recomputes them.

    `lookahead` is `VllmConfig.num_prefill_lookahead_tokens`; a drafter reading `lookahead`
    tokens ahead leaves the last `lookahead - 1` of the prefill with draft-dependent KV.
    `state_backoff` is 1 for hybrid Mamba or bounded-replay models (they need h(N-1)), else 0.
    """
    return max(state_backoff, lookahead - 1)


def drafter_refresh(lookahead: int, backoff: int) -> int:
    """Prompt tokens the prefill computes that the decode recomputes anyway (0 without a drafter).

    The drafter's KV at a position is built from the tokens up to `lookahead` positions after it
    (each MTP module reads one further), so at the last `lookahead` positions the prefill
    computed it was built from tokens the prefill does not have: the decode rebuilds them. And
    at least two in all with the backoff: a decode that recomputes exactly one token is padded by
    vLLM's scheduler with placeholder drafts, a draft round with nothing accepted.
    """
    if lookahead <= 0:
        return 0
    return max(lookahead, 2 - backoff)


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise IncompatibleVllmError(
            f"pdmtp_engine.connector cannot load: the installed vLLM {what}; "
            "the engine image pins the vLLM version this connector was written against"
        )


def _method(owner: type, name: str) -> Callable[..., Any]:
    member = getattr(owner, name, None)
    _require(callable(member), f"has no {owner.__name__}.{name}")
    assert member is not None
    return member


def _parameter_names(owner: type, name: str) -> list[str]:
    return list(inspect.signature(_method(owner, name)).parameters)


def _references(owner: type, name: str, names: Iterable[str]) -> bool:
    """Whether the method's bytecode names every one of `names` (calls or attributes)."""
    referenced = set(_method(owner, name).__code__.co_names)
    return all(n in referenced for n in names)


def check_vllm_compatibility() -> None:
    """Fail loudly unless vLLM has every private member this module depends on."""
    _require(
        _parameter_names(MooncakeConnector, "__init__")
        == ["self", "vllm_config", "role", "kv_cache_config"],
        "MooncakeConnector.__init__ is not (vllm_config, role, kv_cache_config)",
    )
    # The parent builds its scheduler half directly; we replace it after construction.
    _require(
        _references(MooncakeConnector, "__init__", ["MooncakeConnectorScheduler"])
        and _references(MooncakeConnector, "on_new_request", ["on_new_request"])
        and _references(MooncakeConnector, "get_num_new_matched_tokens", ["connector_scheduler"]),
        "MooncakeConnector no longer delegates to self.connector_scheduler",
    )
    _require(
        _parameter_names(MooncakeConnectorScheduler, "__init__")
        == ["self", "vllm_config", "engine_id", "kv_cache_config"],
        "MooncakeConnectorScheduler.__init__ is not (vllm_config, engine_id, kv_cache_config)",
    )
    _require(
        _parameter_names(MooncakeConnectorScheduler, "_get_remote_prefill_token_count")
        == ["self", "num_prompt_tokens"]
        and _references(
            MooncakeConnectorScheduler,
            "get_num_new_matched_tokens",
            ["_get_remote_prefill_token_count"],
        ),
        "MooncakeConnectorScheduler does not size remote prefill loads through "
        "_get_remote_prefill_token_count(num_prompt_tokens)",
    )
    # on_new_request is replaced wholesale: it must still do nothing but the Mamba truncation,
    # or replacing it would drop new behaviour.
    stock_on_new_request_names = set(
        _method(MooncakeConnectorScheduler, "on_new_request").__code__.co_names
    )
    _require(
        _parameter_names(MooncakeConnectorScheduler, "on_new_request") == ["self", "request"]
        and stock_on_new_request_names
        <= {
            "kv_transfer_params",
            "get",
            "_has_mamba",
            "_bounded_replay",
            "_truncate_mamba_request_for_prefill",
        },
        "MooncakeConnectorScheduler.on_new_request does more than the Mamba truncation "
        f"(it references {sorted(stock_on_new_request_names)})",
    )
    # The refresh: the prefill ships only the blocks the decode pulls.
    _require(
        _parameter_names(MooncakeConnectorScheduler, "request_finished")
        == ["self", "request", "block_ids"]
        and _references(
            MooncakeConnectorScheduler,
            "request_finished",
            ["_reqs_need_send", "get_sw_clipped_blocks"],
        ),
        "MooncakeConnectorScheduler.request_finished is not (request, block_ids) queueing the "
        "prefill's blocks to send",
    )
    # The hand-off counts: vLLM merges the scheduler half's stats into the workers' payload
    # (`aggregate`) and rebuilds them in the API server with the connector's own classes.
    _require(
        _parameter_names(MooncakeConnectorScheduler, "update_state_after_alloc")
        == ["self", "request", "blocks", "num_external_tokens"]
        and _references(
            MooncakeConnectorScheduler,
            "update_state_after_alloc",
            ["kv_transfer_params", "_reqs_need_recv"],
        ),
        "MooncakeConnectorScheduler.update_state_after_alloc is not "
        "(request, blocks, num_external_tokens) starting remote prefills",
    )
    _require(
        _references(MooncakeConnectorWorker, "__init__", ["MooncakeKVConnectorStats", "xfer_stats"])
        and _references(MooncakeConnectorWorker, "get_kv_connector_stats", ["xfer_stats"]),
        "MooncakeConnectorWorker keeps no MooncakeKVConnectorStats in xfer_stats",
    )
    for hook in ("get_kv_connector_stats", "build_kv_connector_stats", "build_prom_metrics"):
        _method(MooncakeConnector, hook)
    _require(
        isinstance(getattr(VllmConfig, "num_prefill_lookahead_tokens", None), property),
        "has no VllmConfig.num_prefill_lookahead_tokens property",
    )
    _method(Request, "get_skip_reading_prefix_cache")
    _require(
        _references(
            Request,
            "__init__",
            [
                "prompt_token_ids",
                "prompt_embeds",
                "_all_token_ids",
                "num_prompt_tokens",
                "max_tokens",
                "kv_transfer_params",
            ],
        ),
        "Request lacks prompt_token_ids/prompt_embeds/_all_token_ids/num_prompt_tokens/"
        "max_tokens/kv_transfer_params",
    )


check_vllm_compatibility()


class BackoffMooncakeConnectorScheduler(MooncakeConnectorScheduler):
    """Scheduler half of the Mooncake connector with the lookahead-aware backoff."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        engine_id: str,
        kv_cache_config: KVCacheConfig,
    ) -> None:
        super().__init__(vllm_config, engine_id, kv_cache_config)
        _require(
            isinstance(getattr(self, "_has_mamba", None), bool)
            and isinstance(getattr(self, "_bounded_replay", None), bool),
            "MooncakeConnectorScheduler sets no boolean _has_mamba/_bounded_replay",
        )
        self.state_backoff: int = 1 if (self._has_mamba or self._bounded_replay) else 0
        self.lookahead: int = vllm_config.num_prefill_lookahead_tokens
        self.prefill_backoff: int = prefill_backoff(self.lookahead, self.state_backoff)
        # Token-indexed KV only: a state (Mamba, bounded replay) exists at the prefill's end and
        # nowhere before it, so the decode cannot start earlier there.
        self.block_sizes: tuple[int, ...] = tuple(
            group.kv_cache_spec.block_size for group in kv_cache_config.kv_cache_groups
        )
        token_indexed = all(
            isinstance(group.kv_cache_spec, AttentionSpec)
            for group in kv_cache_config.kv_cache_groups
        )
        self.drafter_refresh: int = (
            drafter_refresh(self.lookahead, self.prefill_backoff)
            if token_indexed and not self.state_backoff
            else 0
        )
        self.handoff = HandoffStats()

    def prefill_computed_tokens(self, num_prompt_tokens: int) -> int:
        """Prompt tokens the prefill computes: all but the backoff (a prompt no longer than the
        backoff is computed whole)."""
        if self.prefill_backoff and num_prompt_tokens > self.prefill_backoff:
            return num_prompt_tokens - self.prefill_backoff
        return num_prompt_tokens

    def _get_remote_prefill_token_count(self, num_prompt_tokens: int) -> int:
        """Both sides: the prompt tokens whose KV the decode pulls, the prefill's computed ones
        but the refresh (a prefill that computed no more than the refresh is pulled whole)."""
        computed = self.prefill_computed_tokens(num_prompt_tokens)
        if self.drafter_refresh and computed > self.drafter_refresh:
            return computed - self.drafter_refresh
        return computed

    def on_new_request(self, request: Request) -> None:
        """Runs from Scheduler.add_request, before the prefix-cache lookup. Prefill side: the
        truncation. Decode side: a request that comes with no remote prefill is decode-only."""
        params = request.kv_transfer_params
        if params is not None and params.get("do_remote_decode"):
            self._truncate_request_for_prefill(request)
        elif self.is_kv_consumer and not (params and params.get("do_remote_prefill")):
            self.handoff.record_decode_only()

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """Decode side: count the pull the parent starts here (once per request: it clears
        do_remote_prefill), or the decode-only fallback when the parameters cannot pull."""
        params = request.kv_transfer_params
        if self.is_kv_consumer and params and params.get("do_remote_prefill"):
            if not all(key in params for key in REMOTE_PREFILL_KEYS):
                self.handoff.record_decode_only()
            elif num_external_tokens > 0:
                prompt = request.num_prompt_tokens
                computed = self.prefill_computed_tokens(prompt)
                pulled_to = self._get_remote_prefill_token_count(prompt)
                self.handoff.record_pull(
                    num_external_tokens,
                    backoff_tokens=prompt - computed,
                    refreshed_tokens=computed - pulled_to,
                )
        super().update_state_after_alloc(request, blocks, num_external_tokens)

    def request_finished(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Prefill side: ship only the blocks that hold the tokens the decode pulls. vLLM's
        sender pairs a shorter list on the decode with the prefill's last blocks (it takes the
        difference for the decode's own prefix-cache hit), so the lists must match."""
        params = request.kv_transfer_params
        shipping = self.is_kv_producer and params is not None and params.get("do_remote_decode")
        if self.drafter_refresh and shipping:
            assert params is not None
            prompt = request.num_prompt_tokens
            if params.get(TRUNCATED_MARKER):
                prompt += self.prefill_backoff
            pulled = self._get_remote_prefill_token_count(prompt)
            block_ids = tuple(
                group[: -(-pulled // size)]
                for group, size in zip(block_ids, self.block_sizes, strict=True)
            )
        return super().request_finished(request, block_ids)

    def _truncate_request_for_prefill(self, request: Request) -> None:
        backoff = self.prefill_backoff
        params = request.kv_transfer_params
        if (
            not backoff
            or params is None
            # Preemption, rescheduling or a re-added request must never truncate twice.
            or params.get(TRUNCATED_MARKER)
            # The decoder mirrors this only for prompts longer than the backoff.
            or request.num_prompt_tokens <= backoff
            # Prompt-logprob requests skip the prefix cache: the decoder loads nothing and
            # recomputes the whole prompt, so the prefiller must compute all of it.
            or request.get_skip_reading_prefix_cache()
        ):
            return
        if request.prompt_token_ids is not None:
            del request.prompt_token_ids[-backoff:]
        elif request.prompt_embeds is not None:
            request.prompt_embeds = request.prompt_embeds[:-backoff]
        else:
            return
        del request._all_token_ids[-backoff:]
        request.num_prompt_tokens -= backoff
        # The prefiller only fills KV; the one sampled token is discarded by the router.
        request.max_tokens = 1
        params[TRUNCATED_MARKER] = True


class BackoffMooncakeConnector(MooncakeConnector):
    """`MooncakeConnector` whose prefill and decode sides agree on the MTP lookahead backoff."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.connector_scheduler: BackoffMooncakeConnectorScheduler | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = BackoffMooncakeConnectorScheduler(
                vllm_config, self.engine_id, kv_cache_config
            )
        elif self.connector_worker is not None:
            # Its transfers start later (register_kv_caches); its payload must carry the
            # hand-off keys, or merging the scheduler half's into it would fail.
            self.connector_worker.xfer_stats = HandoffStats()

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """The worker's transfer stats (vLLM's), or the scheduler half's hand-off counts."""
        if self.connector_scheduler is not None:
            handoff = self.connector_scheduler.handoff
            return None if handoff.is_empty() else handoff.clone_and_reset()
        return super().get_kv_connector_stats()

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats:
        return HandoffStats(data=data or {})

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics:
        return HandoffPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
