"""Rendering of what real clusters need: model weights from storage, secrets by reference,
pod-level scheduling settings, P/D placement, per-role RDMA devices; and the rules that guard
them (a literal credential, reserved mounts)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from builders import PDDBuilder, compat_revision, pdd
from pdmtp.api.vocabulary import EngineRole
from pdmtp.core.agreement import check
from pdmtp.core.render.children import engine_pod_template
from pdmtp.core.validation import validate


def pod(b: PDDBuilder, role: EngineRole = "prefill") -> dict[str, Any]:
    p = b.build()
    template = engine_pod_template(p, compat_revision(p.spec), role, check(p.spec))
    spec: dict[str, Any] = template["spec"]
    return spec


def engine(b: PDDBuilder, role: EngineRole = "prefill") -> dict[str, Any]:
    container: dict[str, Any] = pod(b, role)["containers"][0]
    return container


def env(b: PDDBuilder, role: EngineRole = "prefill") -> dict[str, Any]:
    return {e["name"]: e for e in engine(b, role)["env"]}


def with_source(source: dict[str, Any]) -> PDDBuilder:
    b = pdd("ds").mtp(3, modules=3)
    b.spec["model"].update(name="deepseek-ai/DeepSeek-V3", source=source)
    return b


def test_pvc_weights_mount_read_only_in_both_roles_and_serve_the_path() -> None:
    b = with_source({"pvc": {"claimName": "weights", "subPath": "dsv3/"}})
    for role in ("prefill", "decode"):
        spec, container = pod(b, role), engine(b, role)
        assert {
            "name": "model",
            "persistentVolumeClaim": {"claimName": "weights", "readOnly": True},
        } in spec["volumes"]
        assert {"name": "model", "mountPath": "/models", "readOnly": True} in container[
            "volumeMounts"
        ]
        args = container["args"]
        assert args[:3] == ["vllm", "serve", "/models/dsv3"]
        assert args[args.index("--served-model-name") + 1] == "deepseek-ai/DeepSeek-V3"
        assert "--revision" not in args
        assert env(b, role)["HF_HUB_OFFLINE"] == {"name": "HF_HUB_OFFLINE", "value": "1"}


def test_image_weights_are_an_image_volume() -> None:
    b = with_source(
        {
            "image": {
                "reference": "registry.example.com/weights/dsv3:1",
                "pullPolicy": "IfNotPresent",
            }
        }
    )
    volume = next(v for v in pod(b)["volumes"] if v["name"] == "model")
    assert volume == {
        "name": "model",
        "image": {"reference": "registry.example.com/weights/dsv3:1", "pullPolicy": "IfNotPresent"},
    }
    assert engine(b)["args"][2] == "/models"


def test_hub_weights_take_the_token_by_reference_and_cache_on_a_pvc() -> None:
    b = with_source(
        {
            "hub": {
                "tokenSecretRef": {"name": "hf", "key": "token"},
                "cachePvc": {"claimName": "hf-cache"},
            }
        }
    )
    e = env(b, "decode")
    assert e["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
    }
    assert e["HF_HOME"] == {"name": "HF_HOME", "value": "/cache/huggingface"}
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}} in pod(
        b, "decode"
    )["volumes"]
    args = engine(b, "decode")["args"]
    assert args[2:5] == ["deepseek-ai/DeepSeek-V3", "--revision", "main"]


def test_env_references_and_env_from_render_as_given() -> None:
    b = pdd("x").prefill(
        env=[
            {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "PLAIN", "value": "1"},
        ],
        envFrom=[{"configMapRef": {"name": "tuning"}, "prefix": "T_"}],
    )
    e = env(b)
    assert e["API_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "s", "key": "k"}}
    assert e["NODE"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert e["PLAIN"] == {"name": "PLAIN", "value": "1"}
    assert engine(b)["envFrom"] == [{"prefix": "T_", "configMapRef": {"name": "tuning"}}]


def test_pod_settings_are_shared_and_a_role_overrides_field_by_field() -> None:
    b = (
        pdd("x")
        .set(
            pod={
                "imagePullSecrets": [{"name": "reg"}],
                "priorityClassName": "inference",
                "schedulerName": "default-scheduler",
                "serviceAccountName": "engine",
                "podSecurityContext": {"runAsNonRoot": True, "fsGroup": 10001},
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
                ],
                "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}}],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }
        )
        .decode(pod={"priorityClassName": "batch", "imagePullSecrets": []})
    )
    prefill, decode = pod(b, "prefill"), pod(b, "decode")
    assert prefill["priorityClassName"] == "inference" and decode["priorityClassName"] == "batch"
    assert prefill["imagePullSecrets"] == [{"name": "reg"}] and "imagePullSecrets" not in decode
    for spec in (prefill, decode):
        assert spec["schedulerName"] == "default-scheduler"
        assert spec["serviceAccountName"] == "engine"
        assert spec["securityContext"] == {"runAsNonRoot": True, "fsGroup": 10001}
        assert spec["topologySpreadConstraints"][0]["topologyKey"] == "zone"
        assert {"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}} in spec["volumes"]
    assert {"name": "scratch", "mountPath": "/scratch"} in engine(b, "decode")["volumeMounts"]


def test_placement_keeps_a_revision_in_one_domain_and_spreads_each_role() -> None:
    b = pdd("x").set(
        placement={"topologyKey": "example.com/rack", "spreadKey": "kubernetes.io/hostname"},
        pod={
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
                        ]
                    }
                }
            }
        },
    )
    p = b.build()
    rev = compat_revision(p.spec)
    for role in ("prefill", "decode"):
        spec = pod(b, role)
        (term,) = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term == {
            "labelSelector": {"matchLabels": {"pdmtp.io/name": "x", "pdmtp.io/revision": rev}},
            "topologyKey": "example.com/rack",
        }
        assert "nodeAffinity" in spec["affinity"]  # the user's affinity is kept
        (spread,) = spec["topologySpreadConstraints"]
        assert spread["topologyKey"] == "kubernetes.io/hostname"
        assert spread["labelSelector"]["matchLabels"]["pdmtp.io/role"] == role


def test_rdma_devices_may_differ_per_role() -> None:
    b = pdd("x").rdma("mlx5_0").decode(kvTransfer={"deviceNames": ["mlx5_2", "mlx5_3"]})

    def devices(role: EngineRole) -> str:
        args = engine(b, role)["args"]
        config = json.loads(args[args.index("--kv-transfer-config") + 1])
        return str(config["kv_connector_extra_config"]["mooncake_device_name"])

    assert devices("prefill") == "mlx5_0" and devices("decode") == "mlx5_2,mlx5_3"


@pytest.mark.parametrize(
    ("env_entry", "refused"),
    [
        ({"name": "HF_TOKEN", "value": "hf_abc"}, True),
        ({"name": "my_api_key", "value": "x"}, True),
        ({"name": "DB_PASSWORD", "value": "x"}, True),
        ({"name": "SECRET_SAUCE", "value": "x"}, True),
        ({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}, False),
        ({"name": "KEYBOARD_LAYOUT", "value": "us"}, True),  # the rule errs on the safe side
        ({"name": "TOKENIZERS_PARALLELISM", "value": "false"}, True),
        ({"name": "LOG_LEVEL", "value": "debug"}, False),
        ({"name": "EMPTY_TOKEN", "value": ""}, False),
    ],
)
def test_literal_credentials_are_refused(env_entry: dict[str, Any], refused: bool) -> None:
    verdict = validate(pdd("x").prefill(env=[env_entry]).dict())
    assert (not verdict.usable) == refused, verdict.problems
    if refused:
        assert "use valueFrom.secretKeyRef" in verdict.message()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            lambda b: b.set(pod={"volumeMounts": [{"name": "x", "mountPath": "/models"}]}),
            "mountPath must be absolute",
        ),
        (
            lambda b: b.set(pod={"volumeMounts": [{"name": "x", "mountPath": "/dev/shm/x"}]}),
            "outside the operator's mounts",
        ),
        (
            lambda b: b.set(pod={"volumes": [{"name": "model", "emptyDir": {}}]}),
            "volume names dshm, model, hf-cache",
        ),
        (
            lambda b: b.prefill(
                env=[{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]
            ),
            "value or valueFrom, not both",
        ),
        (
            lambda b: b.prefill(env=[{"name": "A", "valueFrom": {}}]),
            "valueFrom sets exactly one of",
        ),
        (
            lambda b: b.set(placement={"topologyKey": "rack", "spreadKey": "rack"}),
            "spreadKey must differ",
        ),
        (
            lambda b: b.spec["model"].update(source={"pvc": {"claimName": "w"}, "hub": {}}),
            "exactly one of pvc, image, hub",
        ),
        (
            lambda b: b.spec["model"].update(
                source={"pvc": {"claimName": "w", "subPath": "../etc"}}
            ),
            "without '..'",
        ),
        (
            lambda b: (
                b.spec["model"].update(
                    source={"hub": {"tokenSecretRef": {"name": "hf", "key": "t"}}}
                ),
                b.prefill(
                    env=[
                        {
                            "name": "HF_TOKEN",
                            "valueFrom": {"secretKeyRef": {"name": "o", "key": "t"}},
                        }
                    ]
                ),
            ),
            "remove HF_TOKEN from the roles' env",
        ),
    ],
)
def test_guard_rules(change: Any, words: str) -> None:
    b = pdd("x")
    change(b)
    verdict = validate(b.dict())
    assert not verdict.compatible and words in verdict.message(), verdict.problems
