"""The YAML corpus (cluster/yaml_corpus.py) against the real kubectl: every file goes through
`kubectl create --dry-run=client --validate=false -o json` (its parse, no schema) and through
pdmtp.tools.yamlread; both give the same JSON objects, or both refuse, kubectl in the words the
corpus records. (The CRD is installed only so that kubectl can map the kind; nothing is sent to
the API server.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cluster.kubehelpers import Cluster, kubectl
from cluster.yaml_corpus import CASES, Case, Refused, typed
from pdmtp.tools.yamlread import ReadError, read_bytes, read_json_then_yaml


def kubectl_parse(cluster: Cluster, namespace: str, path: Path) -> tuple[list[Any] | None, str]:
    """What kubectl would send for the file (None when it refuses), and its stderr."""
    done = kubectl(
        cluster,
        "-n",
        namespace,
        "create",
        "--dry-run=client",
        "--validate=false",
        "-o",
        "json",
        "-f",
        str(path),
    )
    if done.returncode != 0:
        return None, done.stderr
    # Read kubectl's output with kubectl's own number rules (int64, else float64).
    printed = read_json_then_yaml(done.stdout, yaml_after=False)
    objects = []
    for obj in printed:
        objects += obj["items"] if obj.get("kind") == "List" and "items" in obj else [obj]
    return [comparable(o) for o in objects], done.stderr


def comparable(obj: Any) -> Any:
    """Without what kubectl adds on its way out (the namespace of -n, creationTimestamp)."""
    if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict):
        meta = {k: v for k, v in obj["metadata"].items() if k not in ("namespace",)}
        if meta.get("creationTimestamp") is None:
            meta.pop("creationTimestamp", None)
        if not meta:  # kubectl makes a metadata map to put the namespace in
            return {k: v for k, v in obj.items() if k != "metadata"}
        return {**obj, "metadata": meta}
    return obj


def compare(cluster: Cluster, namespace: str, path: Path) -> tuple[Any, Any, str]:
    """(kubectl's objects or None, the reader's objects or its ReadError, kubectl's stderr)."""
    sent, stderr = kubectl_parse(cluster, namespace, path)
    try:
        ours: Any = [comparable(o) for o in read_bytes(path.read_bytes())]
    except ReadError as e:
        ours = e
    return sent, ours, stderr


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_kubectl_reads_the_corpus_as_pdmtp_does(
    case: Case, cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> None:
    path = tmp_path / "case.yaml"
    path.write_text(case.text)
    sent, ours, stderr = compare(cluster, namespace, path)
    if isinstance(case.sends, Refused):
        assert sent is None, f"kubectl sends {json.dumps(sent)}"
        assert case.sends.words in stderr, stderr
        assert isinstance(ours, ReadError), ours
        assert case.sends.words in ours.message
    else:
        assert sent is not None, stderr
        assert typed(sent) == typed([comparable(o) for o in case.sends])
        assert not isinstance(ours, ReadError), ours
        assert typed(ours) == typed(sent)


@pytest.mark.parametrize(("written", "taken"), [("2.0", True), ("2.5", False), ("1e20", False)])
def test_integral_floats_for_an_integer_field(
    written: str, taken: bool, cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> None:
    """The API server takes an integral float JSON number for an integer field (kube-openapi's
    type check) from any client; kubectl never sends one (it writes 2.0 as 2); `pdmtp validate`
    reads 2.0 as 2 and takes it too. A fraction, or a float beyond 2^53, is refused by all."""
    from builders import pdd
    from pdmtp.kube import ApiError, load_client, send

    doc = pdd("intfloat").dict()
    doc["spec"]["prefill"]["replicas"] = float(written)
    body = json.dumps(doc)  # Python writes the float as a float: 2.0, 2.5, 1e+20
    assert '"replicas": 2.0' in body or written != "2.0"
    api = load_client(str(cluster.kubeconfig))
    try:
        send(
            api,
            "POST",
            f"/apis/pdmtp.io/v1alpha1/namespaces/{namespace}/pddeployments",
            query=[("dryRun", "All"), ("fieldValidation", "Strict")],
            body=doc,  # the client json.dumps it: these very bytes
        ).read()
        server_takes = True
    except ApiError as e:
        assert e.status == 422, e
        server_takes = False
    assert server_takes == taken
    path = tmp_path / "pdd.json"
    path.write_text(body)
    code, _ = _validate(path)
    assert (code == 0) == taken


def _validate(path: Path) -> tuple[int, str]:
    import contextlib
    import io

    from pdmtp.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["validate", str(path)])
    return code, out.getvalue()


NULLS = [
    ("a known field: dropped, defaulted", "prefill", "replicas", True),
    ("an unknown field: dropped too", "prefill", "replicaz", True),
    ("a map value: dropped", "resources", "requests.memory", True),
    ("a list item: refused", "prefill", "extraArgs[0]", False),
]


@pytest.mark.parametrize(("name", "where", "field", "taken"), NULLS, ids=[n[0] for n in NULLS])
def test_nulls_as_the_api_server_takes_them(
    name: str,
    where: str,
    field: str,
    taken: bool,
    cluster: Cluster,
    crd: None,
    namespace: str,
    tmp_path: Path,
) -> None:
    """`x: ~` (or `x:`) is dropped before validation (none of the PDDeployment's fields is
    nullable), so a default applies, even for a key the schema does not know; a null list item
    is refused. pdmtp validate does the same."""
    from builders import pdd

    doc = pdd("nulls").dict()
    if where == "resources":
        doc["spec"]["decode"]["resources"] = {"requests": {"memory": None, "cpu": "1"}}
    elif field.endswith("[0]"):
        doc["spec"][where][field[:-3]] = [None]
    else:
        doc["spec"][where][field] = None
    path = tmp_path / "pdd.yaml"
    path.write_text(json.dumps(doc))
    applied = kubectl(
        cluster, "-n", namespace, "apply", "--dry-run=server", "--validate=strict", "-f", str(path)
    )
    assert (applied.returncode == 0) == taken, applied.stderr
    code, said = _validate(path)
    assert (code == 0) == taken, said
