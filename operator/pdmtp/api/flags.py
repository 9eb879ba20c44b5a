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
    # A multi-node group's wiring (vLLM 0.33 arg_utils: --nnodes/-n, --node-rank/-r; the data
    # parallel ones and their short forms): the operator gives each rank its own.
    **dict.fromkeys(
        (
            "--nnodes",
            "-n",
            "--node-rank",
            "-r",
            "--master-addr",
            "--master-port",
            "--headless",
            "--data-parallel-address",
            "-dpa",
            "--data-parallel-rpc-port",
            "-dpp",
            "--data-parallel-start-rank",
            "-dpr",
            "--data-parallel-rank",
            "-dpn",
            "--data-parallel-size-local",
            "-dpl",
        ),
        "spec.<role>.multiNode (the operator wires a group's ranks)",
    ),
}
"""Flag -> the field (or owner) that sets it."""


def _flag_stem(flag: str) -> str:
    # vLLM's parser reads `--kv_cache_dtype` as `--kv-cache-dtype`; match both spellings.
    if flag.startswith("--"):
        return "--" + flag[2:].replace("-", "[-_]")
    return flag


def flag_pattern(flags: Iterable[str]) -> str:
    """RE2-compatible pattern matching an argument that sets one of `flags` (CEL `matches`):
    `--flag`, `--flag=value`, the underscore spelling, and a one-letter short form with its
    value attached (argparse reads `-n2` as `-n 2`; `-tp4` it refuses)."""
    flags = list(flags)
    attached = [f for f in flags if len(f) == 2 and f[0] == "-" and f[1] != "-"]
    rest = [f for f in flags if f not in attached]
    forms = ["(" + "|".join(_flag_stem(f) for f in rest) + ")(=.*)?"]
    if attached:
        forms.append("(" + "|".join(attached) + ").*")
    return "^(" + "|".join(forms) + ")$"


def _canonical(name: str, known: Iterable[str]) -> str:
    if name.startswith("--"):
        return name[:2] + name[2:].replace("_", "-")
    return name if name in known else name[:2]  # -n2: -n with its value attached


OWNED_FLAG_PATTERN: Final = flag_pattern(OWNED_FLAGS)
"""RE2-compatible pattern matching an argument that sets an owned flag (CEL `matches`)."""

_OWNED = re.compile(OWNED_FLAG_PATTERN)


def owned_flag(arg: str) -> str | None:
    """The canonical owned flag that `arg` sets, or None when the argument is free to use."""
    if not _OWNED.fullmatch(arg):  # fullmatch: Python's `$` also matches before a final \n
        return None
    return _canonical(arg.split("=", 1)[0], OWNED_FLAGS)


def flags_in(pattern: str, flags: Iterable[str], args: Iterable[str]) -> list[str]:
    """The canonical flags of `flags` that `args` set (`pattern` is their `flag_pattern`), in
    order, without repeats."""
    compiled, known = re.compile(pattern), list(flags)
    found: list[str] = []
    for arg in args:
        if compiled.fullmatch(arg):
            flag = _canonical(arg.split("=", 1)[0], known)
            if flag not in found:
                found.append(flag)
    return found


def owned_flags_in(args: Iterable[str]) -> list[str]:
    """Owned flags that `args` try to set, in order, without repeats."""
    found: list[str] = []
    for arg in args:
        flag = owned_flag(arg)
        if flag is not None and flag not in found:
            found.append(flag)
    return found
