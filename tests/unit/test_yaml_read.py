"""pdmtp.tools.yamlread reads every file of the YAML corpus (tests/cluster/yaml_corpus.py) into
exactly what kubectl sends for it, types included (2 and 2.0 are not the same JSON to a schema), and
`pdmtp validate` judges that object."""

from __future__ import annotations

import datetime
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import pdd
from cluster.yaml_corpus import CASES, Case, Refused, table, typed
from pdmtp.cli import main
from pdmtp.tools import yamlread
from pdmtp.tools.yamlread import ReadError, read_stream


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_reads_what_kubectl_sends(case: Case) -> None:
    if isinstance(case.sends, Refused):
        with pytest.raises(ReadError) as refused:
            read_stream(case.text)
        assert case.sends.words in refused.value.message
    else:
        assert typed(read_stream(case.text)) == typed(case.sends)


def test_the_corpus_covers_the_issues_forms() -> None:
    shown = " ".join(c.shown + c.text for c in CASES)
    for form in ("1:30", "5e-2", "1e3", ".5", "2001-12-14", "0777", "0o17", "0x1F", "0b101"):
        assert form in shown, form
    for form in ("1_000", "yes", "Off", "True", "NULL", "~", ".inf", ".nan", "!!binary", "!!str"):
        assert form in shown, form
    for form in ("&x", "*x", "<<", "...", "---", '{"apiVersion"', "9223372036854775808"):
        assert form in shown, form


def test_the_table_lists_every_case_and_agrees() -> None:
    text = table()
    assert text.startswith("## YAML read as kubectl reads it")
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == len(CASES)


def test_every_value_read_is_json() -> None:
    for case in CASES:
        try:
            docs = read_stream(case.text)
        except ReadError:
            continue
        for doc in docs:
            assert yamlread.json_problems(doc) == []
            assert json.loads(yamlread.to_json_bytes(doc)) == doc


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (datetime.date(2024, 1, 1), "spec.model.revision: a date is not a JSON value"),
        (b"\x00", "spec.model.revision: a bytes is not a JSON value"),
        (math.nan, "spec.model.revision: nan is not a JSON number"),
        ({1: "a"}, "spec.model.revision: key 1 is a int, not a string"),
        (2**64, "out of the int64 range"),
    ],
)
def test_values_that_are_not_json_are_named(value: Any, words: str) -> None:
    doc = pdd().dict()
    doc["spec"]["model"]["revision"] = value
    assert words in "; ".join(yamlread.json_problems(doc))


def run(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "pdd.yaml"
    path.write_text(text)
    code = main(["validate", str(path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out + err


def spec_yaml(**changes: str) -> str:
    """A valid spec as YAML with some scalars written by hand (`spec.prefill.replicas: "2.0"`)."""
    text = yaml.safe_dump(pdd().dict(), sort_keys=False)
    for dotted, written in changes.items():
        leaf = dotted.rsplit(".", 1)[-1]
        lines = text.splitlines()
        # The leaf under its parent: the first line with that key after the parent's line.
        parent = dotted.split(".")[-2]
        at = next(i for i, line in enumerate(lines) if line.strip() == f"{parent}:")
        hit = next(i for i in range(at, len(lines)) if lines[i].strip().startswith(f"{leaf}:"))
        indent = lines[hit][: len(lines[hit]) - len(lines[hit].lstrip())]
        lines[hit] = f"{indent}{leaf}: {written}"
        text = "\n".join(lines) + "\n"
    return text


@pytest.mark.parametrize(
    ("written", "code"),
    [
        ("2.0", 0),  # kubectl sends 2: the API server takes it
        ("2e0", 0),
        ("0x2", 0),
        ("1_0", 0),
        ("2.5", 2),
        ("1:30", 2),  # a string, not 90
        ("yes", 2),  # a boolean
        ("9223372036854775808", 2),  # a float beyond int64
    ],
)
def test_validate_judges_what_kubectl_sends(
    written: str, code: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got, out = run(tmp_path, spec_yaml(**{"spec.prefill.replicas": written}), capsys)
    assert got == code, out


def test_a_date_where_a_string_goes_is_a_string(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = spec_yaml(**{"spec.model.name": "2024-01-01"})  # PyYAML: a date, and a crash
    code, out = run(tmp_path, text, capsys)
    assert code == 0, out


def test_a_duplicate_key_is_taken_as_kubectl_takes_it_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """kubectl keeps the last value without a word (go-yaml v2 is not strict there), so the
    verdict is the same as for the last value alone; pdmtp validate says which line repeats."""
    good, bad = spec_yaml(), spec_yaml(**{"spec.prefill.replicas": "0"})
    text = bad + "spec:\n" + good.split("spec:\n", 1)[1]  # a second spec: the valid one
    code, out = run(tmp_path, text, capsys)
    assert code == 0, out
    line = bad.count("\n") + 2  # the second spec's value starts on the line after its key
    assert f'warning: {tmp_path / "pdd.yaml"}: line {line}: key "spec" already set in map' in out
    code, out = run(tmp_path, good + "spec:\n" + bad.split("spec:\n", 1)[1], capsys)
    assert code == 2, out


def test_a_syntax_error_names_the_line_of_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = spec_yaml() + "---\n" + "a: [\n"
    code, out = run(tmp_path, text, capsys)
    lines = spec_yaml().count("\n")
    assert code == 2 and f"not valid YAML at line {lines + 3}" in out, out


def test_excessive_aliasing_is_refused_quickly() -> None:
    laughs = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev = chr(ord("a") + i - 1)
        laughs.append(f"{chr(ord('a') + i)}: &{chr(ord('a') + i)} [{', '.join(['*' + prev] * 10)}]")
    with pytest.raises(ReadError, match="excessive aliasing"):
        read_stream("\n".join(laughs) + "\n")


def test_an_alias_inside_its_own_anchor_is_refused() -> None:
    with pytest.raises(ReadError, match="value contains itself"):
        read_stream("a: &a [*a]\n")


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    with pytest.raises(ReadError, match="nesting deeper than"):
        read_stream("a: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ReadError, match="nesting deeper than"):
        read_stream('{"a": ' + "[" * 5000 + "]" * 5000 + "}")
    assert read_stream("a: " + "[" * 150 + "]" * 150 + "\n")


def test_a_python_value_that_is_not_json_in_a_pod_field_is_a_problem_not_a_crash() -> None:
    from pdmtp.core.validation import validate

    doc = pdd().dict()
    doc["spec"]["pod"] = {"affinity": {"nodeAffinity": datetime.date(2024, 1, 1)}}
    verdict = validate(doc)
    assert verdict.pdd is None and "spec.pod.affinity" in verdict.message()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_pure_python_parser_reads_alike(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without libyaml, PyYAML's own parser stands in: the same objects, the same refusals."""
    with_libyaml: Any
    try:
        with_libyaml = read_stream(case.text)
    except ReadError as e:
        with_libyaml = e.message
    monkeypatch.setattr(yaml, "__with_libyaml__", False)
    try:
        pure: Any = read_stream(case.text)
    except ReadError as e:
        pure = e.message
    if isinstance(with_libyaml, str):  # the parsers word syntax errors apart
        assert isinstance(pure, str)
    else:
        assert typed(pure) == typed(with_libyaml)


@pytest.mark.parametrize(
    ("written", "code"),
    [("~", 0), ("", 0), ("null", 0), ("[~]", 2)],
)
def test_a_null_is_a_field_left_out(
    written: str, code: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API server drops a null map value before validation (nothing in the schema is
    nullable): `replicas: ~` is the default replica count; a null list item is refused
    (tests/cluster/test_yaml_kubectl.py shows the API server doing both)."""
    got, out = run(tmp_path, spec_yaml(**{"spec.prefill.replicas": written}), capsys)
    assert got == code, out


@pytest.mark.parametrize(
    ("meta", "words"),
    [
        ("  Spec: 1\n", "metadata.Spec: unknown field"),
        ("  metadata: {}\n", "metadata.metadata: unknown field"),
        ("  labels: {a: 1}\n", "metadata.labels: must be a map of strings"),
        ("  generation: x\n", "metadata.generation: must be an integer"),
    ],
)
def test_metadata_is_decoded_strictly(
    meta: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API server's strict decoding refuses what ObjectMeta does not have (found by the
    differential test: `metadata.Spec` was let through)."""
    text = spec_yaml().replace("metadata:\n", "metadata:\n" + meta, 1)
    code, out = run(tmp_path, text, capsys)
    assert code == 2 and words in out, out


def test_bytes_that_are_not_utf8_are_read_as_kubectl_reads_them() -> None:
    """go-yaml passes them through and Go's JSON writes U+FFFD for each (kubectl v1.36.3)."""
    data = b"apiVersion: v1\nkind: ConfigMap\nprobe: a\xe0!b\nk\xd0\xe4: 1\n"
    assert yamlread.read_bytes(data) == [
        {"apiVersion": "v1", "kind": "ConfigMap", "probe": "a\ufffd!b", "k\ufffd\ufffd": 1}
    ]
    with pytest.raises(ReadError, match="control characters"):
        yamlread.read_bytes(b"probe: a\x08b\n")
