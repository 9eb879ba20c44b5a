"""Offline validation agrees with admission: a corpus of bad specs, each fed to `pdmtp validate`
and to `kubectl apply --dry-run=server` on the real API server. Both refuse every one, `pdmtp
validate` with a one-line reason and no traceback; where the API server's refusal comes from one
of the CRD's CEL rules, both say the rule's own words. The samples pass both.

The multi-node shapes (cluster/pod_corpus.py MULTI_NODE, docs/validation-corpus.md): every shape
vLLM would refuse is refused by both in the same words, every good one stored by both."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import pdd
from cluster.kubehelpers import Cluster
from cluster.pod_corpus import MULTI_NODE, Shape
from cluster.pod_corpus import doc as shape_doc

REPO = Path(__file__).resolve().parents[2]
PDMTP = Path(sys.executable).parent / "pdmtp"

Doc = dict[str, Any]


def base() -> Doc:
    return pdd("corpus").mtp(3, modules=3).dict()


@dataclass(frozen=True)
class Case:
    name: str
    change: Callable[[Doc], None]
    words: str | None = None
    """Text both refusals must contain (a CEL rule's message); None where the API server's
    schema validation words it its own way (types, enums, bounds, unknown fields)."""
    exit_code: int = 2
    """pdmtp validate: 2 unusable, 1 incompatible (a cross-role rule, the agreement's finding)."""


def setter(path: str, value: Any) -> Callable[[Doc], None]:
    def change(doc: Doc) -> None:
        *parents, last = path.split(".")
        node = doc
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    return change


CASES = [
    Case(
        "image with a space",
        setter("spec.image", "registry.example.com/pdmtp engine:1"),
        "spec.image must be an image reference",
    ),
    Case(
        "image with an upper-case path",
        setter("spec.image", "example.com/PDMTP/engine:1"),
        "spec.image must be an image reference",
    ),
    Case(
        "router image with a trailing colon",
        setter("spec.router.image", "pdmtp-router:"),
        "spec.router.image must be an image reference",
    ),
    Case("numSpeculativeTokens as a string", setter("spec.speculative.numSpeculativeTokens", "3")),
    Case("replicas as a string", setter("spec.prefill.replicas", "2")),
    Case("a boolean as a string", setter("spec.engine.disableHybridKVCacheManager", "true")),
    Case("upper-case name", setter("metadata.name", "Demo"), "metadata.name must be a DNS-1035"),
    Case(
        "name starting with a digit",
        setter("metadata.name", "1demo"),
        "metadata.name must be a DNS-1035",
    ),
    Case("name too long", setter("metadata.name", "d" * 41), "metadata.name must be a DNS-1035"),
    Case(
        "memory quantity lots",
        setter("spec.decode.resources", {"limits": {"memory": "lots"}}),
        "values must be non-negative Kubernetes quantities",
    ),
    Case(
        "negative cpu",
        setter("spec.decode.resources", {"requests": {"cpu": "-1"}}),
        "values must be non-negative Kubernetes quantities",
    ),
    Case(
        "resource name with a space",
        setter("spec.prefill.resources", {"requests": {"my resource": "1"}}),
        "keys must be resource names",
    ),
    Case(
        "maxSurge and maxUnavailable both 0",
        setter("spec.rollout", {"maxSurge": 0, "maxUnavailable": 0, "drainSeconds": 0}),
        "spec.rollout.maxSurge and spec.rollout.maxUnavailable cannot both be 0",
    ),
    Case(
        "node selector value with a space",
        setter("spec.decode.nodeSelector", {"rack": "a b"}),
        "nodeSelector values must be label values",
    ),
    Case(
        "node selector key starting with a dash",
        setter("spec.decode.nodeSelector", {"-rack": "a"}),
        "nodeSelector keys must be",
    ),
    Case(
        "pod annotation key with a space",
        setter("spec.prefill.podAnnotations", {"my key": "x"}),
        "podAnnotations keys must be",
    ),
    Case(
        "toleration Exists with a value",
        setter("spec.prefill.tolerations", [{"key": "gpu", "operator": "Exists", "value": "x"}]),
        "a toleration with operator Exists matches any value",
    ),
    Case(
        "tolerationSeconds without NoExecute",
        setter(
            "spec.prefill.tolerations",
            [{"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 5}],
        ),
        "tolerationSeconds applies only to effect NoExecute",
    ),
    Case(
        "env sets an owned variable",
        setter("spec.prefill.env", [{"name": "VLLM_HOST_IP", "value": "1.2.3.4"}]),
        "env must not set VLLM_HOST_IP",
    ),
    Case(
        # It was not refused once: the operator's entry and the user's made two of one name,
        # which server-side apply refuses, and the role's Deployment was never written.
        "env moves the metrics port the operator scrapes",
        setter("spec.decode.env", [{"name": "PDMTP_METRICS_PORT", "value": "29199"}]),
        "PDMTP_METRICS_PORT",
    ),
    Case(
        "extraArgs set an owned flag",
        setter("spec.prefill.extraArgs", ["--block-size=32"]),
        "a role's extraArgs must not set flags owned by typed fields",
        exit_code=1,
    ),
    Case(
        "tensor-parallel sizes that do not divide",
        lambda d: (
            setter("spec.prefill.tensorParallelSize", 3)(d),
            setter("spec.decode.tensorParallelSize", 2)(d),
        ),
        "spec.prefill.tensorParallelSize and spec.decode.tensorParallelSize must divide",
        exit_code=1,
    ),
    Case(
        "eagle without a draft model",
        setter("spec.speculative", {"method": "eagle", "numSpeculativeTokens": 2}),
        "spec.speculative.method drafts with a separate model",
        exit_code=1,
    ),
    Case(
        "numSpeculativeTokens above mtpModules, not a multiple",
        setter("spec.speculative.numSpeculativeTokens", 4),  # the base declares 3 modules
        "must be at most spec.model.mtpModules or a multiple of it",
        exit_code=1,
    ),
    Case(
        "a role's numSpeculativeTokens above mtpModules, not a multiple",
        setter("spec.decode.speculative", {"numSpeculativeTokens": 5}),
        "must be at most spec.model.mtpModules or a multiple of it",
        exit_code=1,
    ),
    Case(
        "rdma without devices",
        setter("spec.kvTransfer", {"protocol": "rdma"}),
        "spec.kvTransfer.deviceNames must list the RDMA devices",
        exit_code=1,
    ),
    Case(
        "bootstrap port on the engine's metrics port",
        setter("spec.kvTransfer", {"protocol": "tcp", "bootstrapPort": 29100}),
        "spec.kvTransfer.bootstrapPort must differ from the engine's own ports",
    ),
    Case(
        "autoscaling minReplicas above maxReplicas",
        setter("spec.autoscaling", {"decode": {"minReplicas": 4, "maxReplicas": 2}}),
        "spec.autoscaling.<role>.minReplicas must be <= maxReplicas",
    ),
    Case(
        "autoscaling targets on an External role",
        setter(
            "spec.autoscaling",
            {
                "decode": {
                    "source": "External",
                    "minReplicas": 1,
                    "maxReplicas": 4,
                    "targets": [{"signal": "kvCacheUsage", "value": 0.8}],
                }
            },
        ),
        "a role with source: External is scaled through its PDRoleScale",
    ),
    Case(
        "decode tokens target without an expected acceptance",
        setter(
            "spec.autoscaling",
            {
                "decode": {
                    "minReplicas": 1,
                    "maxReplicas": 4,
                    "targets": [{"signal": "decodeTokensPerSecondPerPod", "value": 2000}],
                }
            },
        ),
        "set expectedAcceptanceLength",
    ),
    Case(
        "ratio band no pair within the bounds reaches",
        setter(
            "spec.autoscaling",
            {
                "prefill": {"minReplicas": 4, "maxReplicas": 8},
                "decode": {"minReplicas": 1, "maxReplicas": 1},
                "ratio": {"min": 0.5, "max": 2},
            },
        ),
        "no prefill and decode counts within the roles' minReplicas",
    ),
    Case(
        "autoscaling minReplicas 0",
        setter("spec.autoscaling", {"prefill": {"minReplicas": 0, "maxReplicas": 2}}),
    ),
    Case(
        "a signal that does not exist",
        setter(
            "spec.autoscaling",
            {
                "prefill": {
                    "minReplicas": 1,
                    "maxReplicas": 2,
                    "targets": [{"signal": "gpuUtilisation", "value": 0.8}],
                }
            },
        ),
    ),
    Case("unknown field", setter("spec.prefill.replica", 2)),
    Case("replicas 0", setter("spec.decode.replicas", 0)),
    Case("block size not in the enum", setter("spec.engine.blockSize", 17)),
    Case("missing model", lambda d: d["spec"].pop("model")),
]


def pdmtp_validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PDMTP), "validate", str(path)], capture_output=True, text=True, timeout=60
    )


def kubectl_apply(cluster: Cluster, namespace: str, path: Path) -> subprocess.CompletedProcess[str]:
    kubectl = cluster.local.bin_dir / "kubectl" if cluster.local else Path("kubectl")
    return subprocess.run(
        [
            str(kubectl),
            "--kubeconfig",
            str(cluster.kubeconfig),
            "-n",
            namespace,
            "apply",
            "--dry-run=server",
            "-f",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_refused_in_one_line(done: subprocess.CompletedProcess[str], exit_code: int) -> None:
    assert done.returncode == exit_code, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if not line.startswith("  ")]
    assert len(lines) == 1, done.stdout


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_validate_and_the_api_server_refuse_alike(
    case: Case, cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> None:
    doc = base()
    case.change(doc)
    path = tmp_path / "pdd.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))

    offline = pdmtp_validate(path)
    assert_refused_in_one_line(offline, case.exit_code)
    admission = kubectl_apply(cluster, namespace, path)
    assert admission.returncode != 0, f"the API server stored it:\n{admission.stdout}"
    if case.words is not None:
        assert case.words in offline.stdout, offline.stdout
        assert case.words in admission.stderr, admission.stderr


JUNK = {
    "binary": bytes(range(256)) * 4,
    "empty": b"",
    "not yaml": b"spec: [\n",
    "a list": b"- 1\n- 2\n",
    "another kind": yaml.safe_dump(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    ).encode(),
}


@pytest.mark.parametrize("name", sorted(JUNK))
def test_junk_files_are_refused_by_both(
    name: str, cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> None:
    path = tmp_path / "junk.yaml"
    path.write_bytes(JUNK[name])
    offline = pdmtp_validate(path)
    assert_refused_in_one_line(offline, 2)
    if name != "another kind":  # a ConfigMap is fine for kubectl; pdmtp wants a PDDeployment
        assert kubectl_apply(cluster, namespace, path).returncode != 0


@pytest.mark.parametrize("sample", ["minimal.yaml", "full.yaml", "demo.yaml", "production.yaml"])
def test_samples_pass_both(
    sample: str, cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> None:
    doc = yaml.safe_load((REPO / "samples" / sample).read_text())
    doc["metadata"].pop("namespace", None)
    path = tmp_path / sample
    path.write_text(yaml.safe_dump(doc))
    assert pdmtp_validate(path).returncode == 0
    done = kubectl_apply(cluster, namespace, path)
    assert done.returncode == 0, done.stderr


GROUP_REFUSED = [s for s in MULTI_NODE if s.layer != "accepted"]
GROUP_ACCEPTED = [s for s in MULTI_NODE if s.layer == "accepted"]


@pytest.mark.parametrize("shape", GROUP_REFUSED, ids=[s.name for s in GROUP_REFUSED])
def test_multi_node_shapes_are_refused_alike(
    shape: Shape, cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> None:
    path = tmp_path / "pdd.yaml"
    path.write_text(yaml.safe_dump(shape_doc(shape), sort_keys=False))
    offline = pdmtp_validate(path)
    assert_refused_in_one_line(offline, shape.exit_code)
    assert shape.words in offline.stdout, offline.stdout
    admission = kubectl_apply(cluster, namespace, path)
    assert admission.returncode != 0, f"the API server stored it:\n{admission.stdout}"
    assert shape.words in admission.stderr, admission.stderr


@pytest.mark.parametrize("shape", GROUP_ACCEPTED, ids=[s.name for s in GROUP_ACCEPTED])
def test_good_multi_node_shapes_pass_both(
    shape: Shape, cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> None:
    path = tmp_path / "pdd.yaml"
    path.write_text(yaml.safe_dump(shape_doc(shape), sort_keys=False))
    offline = pdmtp_validate(path)
    assert offline.returncode == 0, offline.stdout + offline.stderr
    done = kubectl_apply(cluster, namespace, path)
    assert done.returncode == 0, done.stderr
