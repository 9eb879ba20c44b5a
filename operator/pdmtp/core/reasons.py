"""Condition types and reasons: the one vocabulary status, events and `pdmtp validate` speak."""

from typing import Final

# Condition types.
CONFIG_COMPATIBLE: Final = "ConfigCompatible"
AVAILABLE: Final = "Available"
PROGRESSING: Final = "Progressing"
DEGRADED: Final = "Degraded"
CONDITION_TYPES: Final = (CONFIG_COMPATIBLE, AVAILABLE, PROGRESSING, DEGRADED)

# ConfigCompatible reasons.
COMPATIBLE: Final = "Compatible"
LOOKAHEAD_MISMATCH: Final = "LookaheadMismatch"
MTP_MODULES_UNKNOWN: Final = "MTPModulesUnknown"
TENSOR_PARALLEL_INDIVISIBLE: Final = "TensorParallelIndivisible"
MAX_MODEL_LEN_MISMATCH: Final = "MaxModelLenMismatch"
OWNED_FLAG_IN_EXTRA_ARGS: Final = "OwnedFlagInExtraArgs"
SPECULATIVE_OVERRIDE_WITHOUT_METHOD: Final = "SpeculativeOverrideWithoutMethod"
RDMA_DEVICES_MISSING: Final = "RDMADevicesMissing"
DRAFT_MODEL_MISSING: Final = "DraftModelMissing"
SPECULATIVE_TOKENS_INDIVISIBLE: Final = "SpeculativeTokensIndivisible"
INVALID_SPEC: Final = "InvalidSpec"

# Available reasons.
MINIMUM_REPLICAS_AVAILABLE: Final = "MinimumReplicasAvailable"
MINIMUM_REPLICAS_UNAVAILABLE: Final = "MinimumReplicasUnavailable"
NO_SERVING_REVISION: Final = "NoServingRevision"

# Progressing reasons.
ROLLOUT_IN_PROGRESS: Final = "RolloutInProgress"
ROLLOUT_COMPLETE: Final = "RolloutComplete"
ROLLOUT_BLOCKED: Final = "RolloutBlocked"
PODS_UNSCHEDULABLE: Final = "PodsUnschedulable"

# Degraded reasons.
AS_EXPECTED: Final = "AsExpected"
ENGINE_REFUSED_CONFIG: Final = "EngineRefusedConfig"
ENGINE_TERMINATED: Final = "EngineTerminated"
