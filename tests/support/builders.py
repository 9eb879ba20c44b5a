"""Fluent builders for PDDeployment test objects: `pdd("x").prefill(replicas=2, tp=4).build()`."""

from __future__ import annotations

import copy
from typing import Any

from pdmtp.api.v1alpha1 import PDDeployment, PDDeploymentSpec
from pdmtp.core.effective import resolve
from pdmtp.core.revision import revision_of


class PDDBuilder:
    """Starts from a small valid spec (TCP, MTP k=1) and changes one thing per call."""

    def __init__(self, name: str, namespace: str | None = None) -> None:
        self.obj: dict[str, Any] = {
            "apiVersion": "pdmtp.io/v1alpha1",
            "kind": "PDDeployment",
            "metadata": {"name": name},
            "spec": {
                "model": {"name": "org/model"},
                "image": "pdmtp-engine:test",
                "speculative": {"method": "mtp", "numSpeculativeTokens": 1},
                "kvTransfer": {"protocol": "tcp"},
                "prefill": {"replicas": 1, "tensorParallelSize": 1},
                "decode": {"replicas": 1, "tensorParallelSize": 1},
                "rollout": {"maxSurge": 1, "maxUnavailable": 0, "drainSeconds": 0},
            },
        }
        if namespace is not None:
            self.obj["metadata"]["namespace"] = namespace

    @property
    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.obj["spec"]
        return spec

    def _role(
        self,
        role: str,
        replicas: int | None,
        tp: int | None,
        k: int | None,
        extra_args: list[str] | None,
        **fields: Any,
    ) -> PDDBuilder:
        r = self.spec[role]
        if replicas is not None:
            r["replicas"] = replicas
        if tp is not None:
            r["tensorParallelSize"] = tp
        if k is not None:
            r["speculative"] = {"numSpeculativeTokens": k}
        if extra_args is not None:
            r["extraArgs"] = extra_args
        r.update(fields)
        return self

    def prefill(
        self,
        replicas: int | None = None,
        tp: int | None = None,
        k: int | None = None,
        extra_args: list[str] | None = None,
        **fields: Any,
    ) -> PDDBuilder:
        return self._role("prefill", replicas, tp, k, extra_args, **fields)

    def decode(
        self,
        replicas: int | None = None,
        tp: int | None = None,
        k: int | None = None,
        extra_args: list[str] | None = None,
        **fields: Any,
    ) -> PDDBuilder:
        return self._role("decode", replicas, tp, k, extra_args, **fields)

    def mtp(self, k: int, modules: int | None = None, method: str = "mtp") -> PDDBuilder:
        self.spec["speculative"] = {"method": method, "numSpeculativeTokens": k}
        if modules is None:
            self.spec["model"].pop("mtpModules", None)
        else:
            self.spec["model"]["mtpModules"] = modules
        return self

    def no_speculation(self) -> PDDBuilder:
        self.spec.pop("speculative", None)
        return self

    def rdma(self, *devices: str) -> PDDBuilder:
        self.spec["kvTransfer"] = {"protocol": "rdma", "deviceNames": list(devices)}
        return self

    def engine(self, **fields: Any) -> PDDBuilder:
        self.spec.setdefault("engine", {}).update(fields)
        return self

    def rollout(self, **fields: Any) -> PDDBuilder:
        self.spec["rollout"].update(fields)
        return self

    def router(self, **fields: Any) -> PDDBuilder:
        self.spec.setdefault("router", {}).update(fields)
        return self

    def set(self, **fields: Any) -> PDDBuilder:
        self.spec.update(fields)
        return self

    def unjudged(self) -> PDDBuilder:
        """Report the verdict, act on nothing (`unjudged`)."""
        self.obj = unjudged(self.obj)
        return self

    def dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.obj)

    def build(self, uid: str = "00000000-0000-0000-0000-000000000001") -> PDDeployment:
        obj = self.dict()
        obj["metadata"].setdefault("namespace", "default")
        obj["metadata"].setdefault("uid", uid)
        return PDDeployment.model_validate(obj)


def pdd(name: str = "demo", namespace: str | None = None) -> PDDBuilder:
    return PDDBuilder(name, namespace)


def unjudged(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` with spec.verification.mode Report, unless the test set spec.verification itself.
    The default mode holds a rollout's old revision until the new one has a verdict, which needs
    engine metrics and traffic: the control-plane tier's engines publish none unless a test
    writes them, and kind's get traffic only under a load run. A test of something else would
    wait for the progress deadline; the tests of the verdict set spec.verification."""
    if obj.get("kind") != "PDDeployment" or "verification" in obj.get("spec", {}):
        return obj
    out = copy.deepcopy(obj)
    out["spec"]["verification"] = {"mode": "Report"}
    return out


def compat_revision(spec: PDDeploymentSpec) -> str:
    """The revision the operator names `spec`'s workloads by (`revision_of` its settings)."""
    return revision_of(resolve(spec))
