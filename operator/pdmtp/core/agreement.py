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
from pdmtp.api.spec_rules import (
    DRAFT_MODEL_RULE,
    ENGINE_EXTRA_ARGS_RULE,
    MAX_MODEL_LEN_RULE,
    RDMA_DEVICES_RULE,
    ROLE_EXTRA_ARGS_RULE,
    SPECULATIVE_OVERRIDE_RULE,
    SPECULATIVE_TOKENS_DIVISIBLE_RULE,
    TP_DIVISIBLE_RULE,
)
from pdmtp.api.v1alpha1 import PDDeploymentSpec
from pdmtp.api.vocabulary import EngineRole, by_role
from pdmtp.core.effective import Effective, EngineRoleSettings, resolve
from pdmtp.core.lookahead import normalise_method, prefill_backoff, prefill_lookahead


@dataclass(frozen=True)
class BrokenRule:
    """One broken rule: a reason from `reasons` and a message naming the field and the fix."""

    reason: str
    message: str


@dataclass(frozen=True)
class Agreement:
    """The verdict on resolved settings: the lookahead each role derives and every rule broken."""

    settings: Effective
    """What was judged; rendering and hashing read it."""
    prefill_lookahead: int | None
    decode_lookahead: int | None
    prefill_backoff: int | None
    findings: tuple[BrokenRule, ...]

    @property
    def compatible(self) -> bool:
        return not self.findings

    def lookahead(self, role: EngineRole) -> int | None:
        return by_role(role, self.prefill_lookahead, self.decode_lookahead)


def role_lookahead(eff: Effective, role: EngineRoleSettings) -> int | None:
    """The lookahead a role's engine will derive; None where it depends on an undeclared
    checkpoint property (multi-token MTP with spec.model.mtpModules unset)."""
    speculative = eff.shared.speculative
    k = role.compat.num_speculative_tokens
    if speculative is None or k is None:
        return 0
    mtp_modules = eff.shared.model.mtp_modules
    if mtp_modules is None:
        if normalise_method(speculative.method) == "mtp" and k > 1:
            return None  # 1 or k, depending on num_nextn_predict_layers
        mtp_modules = 1
    return prefill_lookahead(speculative.method, k, mtp_modules)


def _lookahead_findings(
    eff: Effective, prefill: int | None, decode: int | None
) -> list[BrokenRule]:
    k_prefill = eff.prefill.compat.num_speculative_tokens
    k_decode = eff.decode.compat.num_speculative_tokens
    if (prefill is None or decode is None) and k_prefill != k_decode:
        return [
            BrokenRule(
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
            BrokenRule(
                reasons.LOOKAHEAD_MISMATCH,
                f"the prefill derives lookahead {prefill} (numSpeculativeTokens {k_prefill}) but "
                f"the decode derives {decode} (numSpeculativeTokens {k_decode}) with "
                f"mtpModules {eff.shared.model.mtp_modules}: set spec.prefill.speculative and "
                "spec.decode.speculative numSpeculativeTokens so both derive the same lookahead",
            )
        ]
    return []


def _structure_findings(eff: Effective) -> list[BrokenRule]:
    findings: list[BrokenRule] = []
    p, d = eff.prefill.compat, eff.decode.compat
    tp_p, tp_d = p.tensor_parallel_size, d.tensor_parallel_size
    if tp_p % tp_d and tp_d % tp_p:
        findings.append(
            BrokenRule(
                reasons.TENSOR_PARALLEL_INDIVISIBLE,
                f"{TP_DIVISIBLE_RULE.message} (prefill {tp_p}, decode {tp_d})",
            )
        )
    len_p, len_d = p.max_model_len, d.max_model_len
    if len_p is not None and len_d is not None and len_d < len_p:
        findings.append(
            BrokenRule(
                reasons.MAX_MODEL_LEN_MISMATCH,
                f"{MAX_MODEL_LEN_RULE.message} (decode {len_d}, prefill {len_p}, "
                "spec.engine.maxModelLen included)",
            )
        )
    speculative = eff.shared.speculative
    if speculative is None:
        for role in eff.roles:
            if role.compat.speculative_override:
                findings.append(
                    BrokenRule(
                        reasons.SPECULATIVE_OVERRIDE_WITHOUT_METHOD,
                        f"{SPECULATIVE_OVERRIDE_RULE.message} (spec.{role.name}.speculative is "
                        "set)",
                    )
                )
    elif speculative.method in DRAFT_MODEL_METHODS and speculative.draft_model is None:
        findings.append(
            BrokenRule(
                reasons.DRAFT_MODEL_MISSING,
                f"{DRAFT_MODEL_RULE.message} (spec.speculative.method is {speculative.method})",
            )
        )
    modules = eff.shared.model.mtp_modules
    if speculative is not None and normalise_method(speculative.method) == "mtp" and modules:
        for role in eff.roles:
            k = role.compat.num_speculative_tokens
            if k is not None and k > modules and k % modules:
                findings.append(
                    BrokenRule(
                        reasons.SPECULATIVE_TOKENS_INDIVISIBLE,
                        f"{SPECULATIVE_TOKENS_DIVISIBLE_RULE.message} (spec.{role.name} runs "
                        f"{k} with mtpModules {modules})",
                    )
                )
    kv = eff.shared.kv_transfer
    if kv.protocol == "rdma" and not kv.device_names:
        findings.append(BrokenRule(reasons.RDMA_DEVICES_MISSING, RDMA_DEVICES_RULE.message))
    return findings


def _flag_findings(eff: Effective) -> list[BrokenRule]:
    findings: list[BrokenRule] = []
    sources = [("spec.engine.extraArgs", eff.shared.engine.extra_args, ENGINE_EXTRA_ARGS_RULE)]
    sources += [
        (f"spec.{r.name}.extraArgs", list(r.local.extra_args), ROLE_EXTRA_ARGS_RULE)
        for r in eff.roles
    ]
    for path, args, rule in sources:
        flags = owned_flags_in(args)
        if flags:
            owners = ", ".join(f"{flag} (set by {OWNED_FLAGS[flag]})" for flag in flags)
            findings.append(
                BrokenRule(
                    reasons.OWNED_FLAG_IN_EXTRA_ARGS, f"{rule.message}; {path} sets {owners}"
                )
            )
    return findings


def agreement_of(eff: Effective) -> Agreement:
    """Every cross-role rule, in a stable order, with the lookahead each role derives."""
    prefill = role_lookahead(eff, eff.prefill)
    decode = role_lookahead(eff, eff.decode)
    findings = [
        *_lookahead_findings(eff, prefill, decode),
        *_structure_findings(eff),
        *_flag_findings(eff),
    ]
    agreed = prefill if prefill == decode else None
    state_backoff = eff.shared.engine.state_backoff
    backoff = None if agreed is None else prefill_backoff(agreed, state_backoff)
    return Agreement(eff, prefill, decode, backoff, tuple(findings))


def check(spec: PDDeploymentSpec) -> Agreement:
    """`agreement_of` the spec's resolved settings."""
    return agreement_of(resolve(spec))
