"""Where the engines load the weights from (spec.model.source), rendered the same for both roles:
what `vllm serve` is pointed at, the volumes and mounts, and the Hugging Face environment.

- pvc / image: mounted read-only at /models, served from /models/<subPath> under the model's
  name (`--served-model-name`), with the hub switched off (HF_HUB_OFFLINE=1);
- hub (or no source): `vllm serve <name> --revision <revision>`; a token Secret key projected
  as HF_TOKEN (by reference: its value is never read or copied), a cache PVC as HF_HOME.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdmtp.api import vocabulary as v
from pdmtp.api.v1alpha1 import ModelSpec
from pdmtp.core.objects import Manifest


@dataclass(frozen=True)
class Weights:
    """What the weights add to an engine pod."""

    served: list[str]
    """The `vllm serve` positional model and the flags that go with it."""
    volumes: list[Manifest]
    mounts: list[Manifest]
    env: list[Manifest]


def weights(model: ModelSpec) -> Weights:
    """Everything the model's source adds to an engine pod, worked out once."""
    pod_volumes, mounts = volumes(model)
    return Weights(served_model(model), pod_volumes, mounts, environment(model))


def served_model(model: ModelSpec) -> list[str]:
    """The `vllm serve` positional model and the flags that go with it."""
    source = model.source
    local = source.pvc or source.image if source is not None else None
    if local is None:
        return [model.name, "--revision", model.revision]
    path = v.MODEL_PATH + (f"/{local.sub_path.strip('/')}" if local.sub_path else "")
    return [path, "--served-model-name", model.name]


def volumes(model: ModelSpec) -> tuple[list[Manifest], list[Manifest]]:
    """(pod volumes, engine container mounts) the weights need."""
    source = model.source
    if source is None:
        return [], []
    if source.pvc is not None:
        claim = {"claimName": source.pvc.claim_name, "readOnly": source.pvc.read_only}
        volume = {"name": v.MODEL_VOLUME, "persistentVolumeClaim": claim}
        return [volume], [{"name": v.MODEL_VOLUME, "mountPath": v.MODEL_PATH, "readOnly": True}]
    if source.image is not None:
        image: Manifest = {"reference": source.image.reference}
        if source.image.pull_policy is not None:
            image["pullPolicy"] = source.image.pull_policy
        volume = {"name": v.MODEL_VOLUME, "image": image}
        return [volume], [{"name": v.MODEL_VOLUME, "mountPath": v.MODEL_PATH, "readOnly": True}]
    if source.hub is not None and source.hub.cache_pvc is not None:
        claim = {"claimName": source.hub.cache_pvc.claim_name}
        volume = {"name": v.HF_CACHE_VOLUME, "persistentVolumeClaim": claim}
        return [volume], [{"name": v.HF_CACHE_VOLUME, "mountPath": v.HF_CACHE_PATH}]
    return [], []


def environment(model: ModelSpec) -> list[Manifest]:
    """The Hugging Face environment the source implies."""
    source = model.source
    if source is None:
        return []
    if source.pvc is not None or source.image is not None:
        return [{"name": v.ENV_HF_HUB_OFFLINE, "value": "1"}]
    env: list[Manifest] = []
    hub = source.hub
    if hub is not None and hub.token_secret_ref is not None:
        ref = hub.token_secret_ref.model_dump(by_alias=True, exclude_none=True)
        env.append({"name": v.ENV_HF_TOKEN, "valueFrom": {"secretKeyRef": ref}})
    if hub is not None and hub.cache_pvc is not None:
        env.append({"name": v.ENV_HF_HOME, "value": v.HF_CACHE_PATH})
    return env
