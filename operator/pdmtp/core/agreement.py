"""What both roles must agree on (docs/design.md, "What both roles must agree on"), decided over a
parsed spec.

The CRD's CEL rules reject some of these at admission already; they are checked here again so that
`pdmtp validate` works offline and the operator never trusts that the schema it runs against is
the one it generated.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdmtp.api import reasons
from pdmtp.api.flags import OWNED_FLAGS, owned_flags_in
from pdmtp.api.methods import DRAFT_MODEL_METHODS
from pdmtp.api.v1alpha1 import (
    ENGINE_EXTRA_ARGS_RULE,
    MAX_MODEL_LEN_RULE,
    RDMA_DEVICES_RULE,
    ROLE_EXTRA_ARGS_RULE,
    SPECULATIVE_OVERRIDE_RULE,
    TP_DIVISIBLE_RULE,
    PDDeploymentSpec,
    RoleSpec,
)
from pdmtp.api.vocabulary import ENGINE_ROLES, EngineRole, by_role
from pdmtp.core.lookahead import normalise_method, prefill_backoff, prefill_lookahead


@dataclass(frozen=True)
class Finding:
    """One broken rule: a reason from `reasons` and a message naming the field and the fix."""

    reason: str
    message: str


@dataclass(frozen=True)
class Agreement:
    """The verdict on a spec: the derived lookahead and every rule it breaks."""

    prefill_lookahead: int | None
    decode_lookahead: int | None
    prefill_backoff: int | None
    findings: tuple[Finding, ...]

    @property
    def compatible(self) -> bool:
        return not self.findings

    def lookahead(self, role: EngineRole) -> int | None:
        return by_role(role, self.prefill_lookahead, self.decode_lookahead)


def speculative_tokens(spec: PDDeploymentSpec, role: RoleSpec) -> int | None:
    """The k a role runs with: its override, else the shared one; None without speculation."""
    if spec.speculative is None:
        return None
    if role.speculative is not None:
        return role.speculative.num_speculative_tokens
    return spec.speculative.num_speculative_tokens


def role_lookahead(spec: PDDeploymentSpec, role: RoleSpec) -> int | None:
    """The lookahead a role's engine will derive; None where it depends on an undeclared
    checkpoint property (multi-token MTP with spec.model.mtpModules unset)."""
    k = speculative_tokens(spec, role)
    if spec.speculative is None or k is None:
        return 0
    method = spec.speculative.method
    mtp_modules = spec.model.mtp_modules
    if mtp_modules is None:
        if normalise_method(method) == "mtp" and k > 1:
            return None  # 1 or k, depending on num_nextn_predict_layers
        mtp_modules = 1
    return prefill_lookahead(method, k, mtp_modules)


def role_max_model_len(spec: PDDeploymentSpec, role: RoleSpec) -> int | None:
    """A role's context length: its override, else the shared one (None: vLLM decides)."""
    return role.max_model_len if role.max_model_len is not None else spec.engine.max_model_len


def _lookahead_findings(
    spec: PDDeploymentSpec, prefill: int | None, decode: int | None
) -> list[Finding]:
    k_prefill = speculative_tokens(spec, spec.prefill)
    k_decode = speculative_tokens(spec, spec.decode)
    if (prefill is None or decode is None) and k_prefill != k_decode:
        return [
            Finding(
                reasons.MTP_MODULES_UNKNOWN,
                f"spec.prefill numSpeculativeTokens ({k_prefill}) and spec.decode "
                f"numSpeculativeTokens ({k_decode}) differ and spec.model.mtpModules is not "
                "declared, so agreement on the prefill lookahead cannot be proven: declare "
                "spec.model.mtpModules (the checkpoint's num_nextn_predict_layers) or use the "
                "same numSpeculativeTokens on both roles",
            )
        ]
    if prefill is not None and decode is not None and prefill != decode:
        return [
            Finding(
                reasons.LOOKAHEAD_MISMATCH,
                f"the prefill derives lookahead {prefill} (numSpeculativeTokens {k_prefill}) but "
                f"the decode derives {decode} (numSpeculativeTokens {k_decode}) with "
                f"mtpModules {spec.model.mtp_modules}: set spec.prefill.speculative and "
                "spec.decode.speculative numSpeculativeTokens so both derive the same lookahead",
            )
        ]
    return []


def _structure_findings(spec: PDDeploymentSpec) -> list[Finding]:
    findings: list[Finding] = []
    tp_p, tp_d = spec.prefill.tensor_parallel_size, spec.decode.tensor_parallel_size
    if tp_p % tp_d and tp_d % tp_p:
        findings.append(
            Finding(
                reasons.TENSOR_PARALLEL_INDIVISIBLE,
                f"{TP_DIVISIBLE_RULE.message} (prefill {tp_p}, decode {tp_d})",
            )
        )
    len_p, len_d = role_max_model_len(spec, spec.prefill), role_max_model_len(spec, spec.decode)
    if len_p is not None and len_d is not None and len_d < len_p:
        findings.append(
            Finding(
                reasons.MAX_MODEL_LEN_MISMATCH,
                f"{MAX_MODEL_LEN_RULE.message} (decode {len_d}, prefill {len_p}, "
                "spec.engine.maxModelLen included)",
            )
        )
    if spec.speculative is None:
        for name, role in ((r, spec.role(r)) for r in ENGINE_ROLES):
            if role.speculative is not None:
                findings.append(
                    Finding(
                        reasons.SPECULATIVE_OVERRIDE_WITHOUT_METHOD,
                        f"{SPECULATIVE_OVERRIDE_RULE.message} (spec.{name}.speculative is set)",
                    )
                )
    elif spec.speculative.method in DRAFT_MODEL_METHODS and spec.speculative.draft_model is None:
        findings.append(
            Finding(
                reasons.DRAFT_MODEL_MISSING,
                f"spec.speculative.method {spec.speculative.method} drafts with a separate model: "
                "set spec.speculative.draftModel",
            )
        )
    modules = spec.model.mtp_modules
    if (
        spec.speculative is not None
        and normalise_method(spec.speculative.method) == "mtp"
        and modules
    ):
        for name, role in ((r, spec.role(r)) for r in ENGINE_ROLES):
            k = speculative_tokens(spec, role)
            if k is not None and k > modules and k % modules:
                findings.append(
                    Finding(
                        reasons.SPECULATIVE_TOKENS_INDIVISIBLE,
                        f"spec.{name} runs numSpeculativeTokens {k} with mtpModules {modules}: "
                        "vLLM refuses more draft tokens than MTP modules unless they are a "
                        f"multiple; use at most {modules} or a multiple of it",
                    )
                )
    if spec.kv_transfer.protocol == "rdma" and not spec.kv_transfer.device_names:
        findings.append(
            Finding(
                reasons.RDMA_DEVICES_MISSING,
                RDMA_DEVICES_RULE.message,
            )
        )
    return findings


def _flag_findings(spec: PDDeploymentSpec) -> list[Finding]:
    findings: list[Finding] = []
    sources = [("spec.engine.extraArgs", spec.engine.extra_args, ENGINE_EXTRA_ARGS_RULE)]
    sources += [
        (f"spec.{r}.extraArgs", spec.role(r).extra_args, ROLE_EXTRA_ARGS_RULE) for r in ENGINE_ROLES
    ]
    for path, args, rule in sources:
        flags = owned_flags_in(args)
        if flags:
            owners = ", ".join(f"{flag} (set by {OWNED_FLAGS[flag]})" for flag in flags)
            findings.append(
                Finding(reasons.OWNED_FLAG_IN_EXTRA_ARGS, f"{rule.message}; {path} sets {owners}")
            )
    return findings


def check(spec: PDDeploymentSpec) -> Agreement:
    """Every cross-role rule, in a stable order, with the lookahead each role derives."""
    prefill = role_lookahead(spec, spec.prefill)
    decode = role_lookahead(spec, spec.decode)
    findings = [
        *_lookahead_findings(spec, prefill, decode),
        *_structure_findings(spec),
        *_flag_findings(spec),
    ]
    agreed = prefill if prefill == decode else None
    backoff = None if agreed is None else prefill_backoff(agreed, spec.engine.state_backoff)
    return Agreement(prefill, decode, backoff, tuple(findings))
