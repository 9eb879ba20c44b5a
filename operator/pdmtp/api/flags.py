"""`vllm serve` flags owned by typed PDDeployment fields, and the check that extraArgs avoid them.

The same table feeds the CRD's CEL rules (admission) and the operator's own validation, so the
two layers can never disagree about which flag belongs to which field.
"""

import re
from collections.abc import Iterable, Mapping
from typing import Final

OWNED_FLAGS: Final[Mapping[str, str]] = {
    "--model": "spec.model.name",
    "--revision": "spec.model.revision",
    "--quantization": "spec.model.quantization",
    "-q": "spec.model.quantization",
    "--dtype": "spec.engine.dtype",
    "--kv-cache-dtype": "spec.engine.kvCacheDtype",
    "--block-size": "spec.engine.blockSize",
    "--max-model-len": "spec.engine.maxModelLen",
    "--attention-backend": "spec.engine.attentionBackend",
    "--disable-hybrid-kv-cache-manager": "spec.engine.disableHybridKVCacheManager",
    "--tensor-parallel-size": "spec.<role>.tensorParallelSize",
    "-tp": "spec.<role>.tensorParallelSize",
    "--pipeline-parallel-size": "spec.<role>.pipelineParallelSize",
    "-pp": "spec.<role>.pipelineParallelSize",
    "--speculative-config": "spec.speculative",
    "--kv-transfer-config": "spec.kvTransfer",
    "--shutdown-timeout": "spec.pod.terminationGracePeriodSeconds",
    "--host": "the operator (pods listen on all interfaces)",
    "--port": "the operator (the engine port is fixed)",
}
"""Flag -> the field (or owner) that sets it."""


def _flag_stem(flag: str) -> str:
    # vLLM's parser reads `--kv_cache_dtype` as `--kv-cache-dtype`; match both spellings.
    if flag.startswith("--"):
        return "--" + flag[2:].replace("-", "[-_]")
    return flag


OWNED_FLAG_PATTERN: Final = "^(" + "|".join(_flag_stem(f) for f in OWNED_FLAGS) + ")(=.*)?$"
"""RE2-compatible pattern matching an argument that sets an owned flag (CEL `matches`)."""

_OWNED = re.compile(OWNED_FLAG_PATTERN)


def owned_flag(arg: str) -> str | None:
    """The canonical owned flag that `arg` sets, or None when the argument is free to use."""
    if not _OWNED.fullmatch(arg):  # fullmatch: Python's `$` also matches before a final \n
        return None
    name = arg.split("=", 1)[0]
    canonical = name[:2] + name[2:].replace("_", "-") if name.startswith("--") else name
    return canonical


def owned_flags_in(args: Iterable[str]) -> list[str]:
    """Owned flags that `args` try to set, in order, without repeats."""
    found: list[str] = []
    for arg in args:
        flag = owned_flag(arg)
        if flag is not None and flag not in found:
            found.append(flag)
    return found
