"""YAML read as kubectl reads it (issue 29): files, and what kubectl sends for each.

Every case is a whole file. `sends` is what the pinned kubectl (the control plane's build) sends
the API server for it, one JSON object per document, as observed with `kubectl label --local -o
json` (no cluster) and `kubectl create --dry-run=client -o json -f FILE`; or `Refused(words)`,
kubectl's own words when it refuses the file. A duplicate key is no refusal: kubectl keeps the
last value and says nothing (go-yaml v2, not strict); `pdmtp validate` does the same and warns.
pdmtp.tools.yamlread must give the same objects (tests/unit/test_yaml_read.py), and
tests/cluster/test_yaml_kubectl.py feeds every file to the real kubectl and compares.

    .venv/bin/python tests/cluster/yaml_corpus.py      # the markdown section
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / p) for p in ("", "support")]

HEAD = "apiVersion: pdmtp.io/v1alpha1\nkind: PDDeployment\nmetadata:\n  name: probe\n"
HEAD_OBJECT: dict[str, Any] = {
    "apiVersion": "pdmtp.io/v1alpha1",
    "kind": "PDDeployment",
    "metadata": {"name": "probe"},
}


@dataclass(frozen=True)
class Refused:
    words: str
    """Text kubectl's error contains, and so does pdmtp validate's."""


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    sends: list[dict[str, Any]] | Refused
    shown: str = ""
    """The YAML the table shows (default: the file's text after HEAD)."""
    note: str = ""
    """Said in the table beside pdmtp validate's reading."""


def probe(name: str, value_yaml: str, value: Any) -> Case:
    """A document whose field `probe` is written `value_yaml`; kubectl sends `value`."""
    text = f"{HEAD}probe: {value_yaml}\n"
    sends: list[dict[str, Any]] | Refused = (
        value if isinstance(value, Refused) else [{**HEAD_OBJECT, "probe": value}]
    )
    return Case(name, text, sends, f"probe: {value_yaml}")


def doc(**fields: Any) -> dict[str, Any]:
    return {**HEAD_OBJECT, **fields}


NOT_JSON = "json: unsupported value"
WARNED = 'warns: key "..." already set in map (kubectl keeps the last)'

CASES: list[Case] = [
    # ---- numbers
    probe("sexagesimal (YAML 1.1: 90)", "1:30", "1:30"),
    probe("sexagesimal with three parts", "190:20:30", "190:20:30"),
    probe("exponent without a dot", "5e-2", 0.05),
    probe("exponent, integral", "1e3", 1000),
    probe("upper-case exponent with a sign", "1E+3", 1000),
    probe("leading dot", ".5", 0.5),
    probe("negative leading dot", "-.5", -0.5),
    probe("trailing dot", "2.", 2),
    probe("integral float", "2.0", 2),
    probe("plus sign", "+12", 12),
    probe("negative zero float", "-0.0", 0),
    probe("octal, C style", "0777", 511),
    probe("octal, 0o", "0o17", 15),
    probe("hexadecimal", "0x1F", 31),
    probe("negative hexadecimal", "-0x1F", -31),
    probe("binary", "0b101", 5),
    probe("not octal: 08 reads as a float", "08", 8),
    probe("digit separators", "1_000", 1000),
    probe("digit separators after a prefix", "0x_1F", 31),
    probe("leading underscore: a string", "_1", "_1"),
    probe("int64 max", "9223372036854775807", 9223372036854775807),
    probe("beyond int64: a float", "9223372036854775808", 9.223372036854776e18),
    probe("beyond uint64: a float", "99999999999999999999", 1e20),
    probe("beyond float64: a string", "1e400", "1e400"),
    probe("400 digits: a string", "9" * 400, "9" * 400),
    probe("upper-case binary prefix", "0B11", 3),
    probe("signed binary", "+0b101", 5),
    probe("below int64: a float, written back as int64 min", "-9223372036854775809", -(2**63)),
    probe("leading zeros, not octal", "0089", 89),
    probe("exponent, integral with a fraction", "1.5e3", 1500),
    probe("large exponent", "6.02e23", 6.02e23),
    probe("small exponent", "1e-7", 1e-7),
    probe("prefix alone: a string", "0x", "0x"),
    probe("exponent without digits: a string", "1e", "1e"),
    probe("dot and exponent only: a string", ".e3", ".e3"),
    probe("hex float: a string", "0x1p-2", "0x1p-2"),
    probe("thousands comma: a string", "1,000", "1,000"),
    probe("infinity", ".inf", Refused(NOT_JSON)),
    probe("negative infinity", "-.Inf", Refused(NOT_JSON)),
    probe("not a number", ".nan", Refused(NOT_JSON)),
    probe("inf without a dot: a string", "inf", "inf"),
    # ---- booleans and null
    probe("yes", "yes", True),
    probe("no", "no", False),
    probe("on", "on", True),
    probe("off", "Off", False),
    probe("y", "y", True),
    probe("n", "N", False),
    probe("True", "True", True),
    probe("mixed case: a string", "yEs", "yEs"),
    probe("NULL", "NULL", None),
    probe("tilde", "~", None),
    probe("empty", "", None),
    # ---- dates and tags
    probe("date", "2001-12-14", "2001-12-14"),
    probe("timestamp", "2001-12-14t21:59:43.10-05:00", "2001-12-14t21:59:43.10-05:00"),
    probe("tagged timestamp", "!!timestamp 2001-12-14", "2001-12-14"),
    probe("binary tag", "!!binary aGVsbG8=", "hello"),
    probe("binary tag, not UTF-8", "!!binary /w==", "\ufffd"),
    probe("binary tag, bad base64", "!!binary =x=", Refused("invalid base64")),
    probe("str tag on a number", "!!str 12", "12"),
    probe("str tag on yes", "!!str yes", "yes"),
    probe("int tag on a quoted string", '!!int "12"', 12),
    probe("float tag on an integer", "!!float 1", 1),
    probe("bool tag on an integer", "!!bool 1", Refused("cannot decode !!int `1` as a !!bool")),
    probe("a local tag", "!thing 12", "12"),
    probe("the non-specific tag", "! 12", "12"),
    probe("quoted number", '"12"', "12"),
    # ---- keys
    Case("integer key", HEAD + "probe:\n  1: a\n", [doc(probe={"1": "a"})], "probe: {1: a}"),
    Case("boolean key y", HEAD + "probe:\n  y: a\n", [doc(probe={"true": "a"})], "probe: {y: a}"),
    Case("float key", HEAD + "probe:\n  1.5: a\n", [doc(probe={"1.5": "a"})], "probe: {1.5: a}"),
    Case("float key 1e3", HEAD + "probe:\n  1e3: a\n", [doc(probe={"1000": "a"})], "{1e3: a}"),
    Case(
        "float key, float32 digits",
        HEAD + "probe:\n  0.1: a\n  1234567.0: b\n",
        [doc(probe={"0.1": "a", "1.234567e+06": "b"})],
        "probe: {0.1: a, 1234567.0: b}",
    ),
    Case("null key", HEAD + "probe:\n  ~: a\n", Refused("unsupported map key"), "probe: {~: a}"),
    Case(
        "uint64 key", HEAD + "probe:\n  18446744073709551615: a\n", Refused("unsupported map key")
    ),
    Case("a list as a key", HEAD + "probe:\n  ? [a]\n  : b\n", Refused("invalid map key"), "? [a]"),
    # ---- duplicates, anchors, merges
    Case(
        "duplicate key: the last wins",
        HEAD + "probe: 1\nprobe: 2\n",
        [doc(probe=2)],
        "probe: 1 / probe: 2",
        WARNED,
    ),
    Case(
        "duplicate nested key: the last wins",
        HEAD + "probe:\n  a: 1\n  a: 2\n",
        [doc(probe={"a": 2})],
        "probe: {a: 1, a: 2}",
        WARNED,
    ),
    Case(
        "anchor and alias",
        HEAD + "probe:\n  a: &x {c: 1}\n  b: *x\n",
        [doc(probe={"a": {"c": 1}, "b": {"c": 1}})],
        "a: &x {c: 1}, b: *x",
    ),
    Case(
        "merge key, then a key it sets: the key wins",
        HEAD + "base: &b {p: 1, q: 2}\nprobe:\n  <<: *b\n  q: 3\n",
        [doc(base={"p": 1, "q": 2}, probe={"p": 1, "q": 3})],
        "probe: {<<: *b, q: 3}",
    ),
    Case(
        "a key, then a merge that sets it: the merge wins (go-yaml v2)",
        HEAD + "base: &b {p: 1, q: 2}\nprobe:\n  q: 3\n  <<: *b\n",
        [doc(base={"p": 1, "q": 2}, probe={"p": 1, "q": 2})],
        "probe: {q: 3, <<: *b}",
    ),
    Case(
        "merge of overlapping maps: the first wins",
        HEAD + "a: &a {p: 1}\nb: &b {p: 2}\nprobe:\n  <<: [*a, *b]\n",
        [doc(a={"p": 1}, b={"p": 2}, probe={"p": 1})],
        "probe: {<<: [*a, *b]}",
    ),
    Case(
        "merge key, new keys only",
        HEAD + "base: &b {p: 1}\nprobe:\n  <<: *b\n  q: 3\n",
        [doc(base={"p": 1}, probe={"p": 1, "q": 3})],
        "probe: {<<: *b, q: 3}",
    ),
    Case(
        "merge of a list of maps",
        HEAD + "a: &a {p: 1}\nb: &b {q: 2}\nprobe:\n  <<: [*a, *b]\n",
        [doc(a={"p": 1}, b={"q": 2}, probe={"p": 1, "q": 2})],
        "probe: {<<: [*a, *b]}",
    ),
    Case(
        "merge of a scalar",
        HEAD + "probe:\n  <<: 1\n",
        Refused("map merge requires map or sequence of maps"),
        "probe: {<<: 1}",
    ),
    Case("unknown alias", HEAD + "probe: *nope\n", Refused("unknown anchor 'nope' referenced")),
    # ---- streams
    Case("leading separator", "---\n" + HEAD, [doc()], "--- then a document"),
    Case(
        "empty documents and a comment after ---",
        "---\n---\n# only a comment\n--- # a comment\n" + HEAD + "---\n",
        [doc()],
        "---, ---, a comment, --- # c, a document, ---",
    ),
    Case("document end marker", HEAD + "...\n", [doc()], "a document, then ..."),
    Case(
        "content after the end marker is ignored",
        HEAD + "...\nprobe: 1\n",
        [doc()],
        "a document, ..., probe: 1",
    ),
    Case(
        "two documents",
        HEAD + "probe: 1\n---\n" + HEAD + "probe: 2\n",
        [doc(probe=1), doc(probe=2)],
        "two documents",
    ),
    Case(
        "text after ---",
        HEAD + "---x\n" + HEAD,
        Refused("invalid Yaml document separator: x"),
        "---x",
    ),
    Case(
        "a document on the --- line",
        "--- " + "{a: 1}\n",
        Refused("invalid Yaml document separator: {a: 1}"),
        "--- {a: 1}",
    ),
    Case("a null document", HEAD + "---\nnull\n", [doc()], "a document, then null"),
    Case("CRLF line ends", HEAD.replace("\n", "\r\n") + "probe: 1\r\n", [doc(probe=1)], "CRLF"),
    # ---- JSON
    Case(
        "JSON file",
        '{"apiVersion": "pdmtp.io/v1alpha1", "kind": "PDDeployment", '
        '"metadata": {"name": "probe"}, "probe": 2.0}',
        [doc(probe=2)],
        '{..., "probe": 2.0}',
    ),
    Case(
        "JSON stream of two objects",
        '{"apiVersion": "pdmtp.io/v1alpha1", "kind": "PDDeployment", '
        '"metadata": {"name": "probe"}, "probe": 1e2}\n'
        '{"apiVersion": "pdmtp.io/v1alpha1", "kind": "PDDeployment", '
        '"metadata": {"name": "probe"}, "probe": 0.5}\n',
        [doc(probe=100), doc(probe=0.5)],
        '{..."probe": 1e2} {..."probe": 0.5}',
    ),
    Case(
        "YAML flow mapping starting with {",
        "{apiVersion: pdmtp.io/v1alpha1, kind: PDDeployment, metadata: {name: probe}, "
        "probe: yes}\n",
        [doc(probe=True)],
        "{apiVersion: ..., probe: yes}",
    ),
    Case(
        "a List's items",
        "apiVersion: v1\nkind: List\nitems:\n- "
        + HEAD.replace("\n", "\n  ").rstrip()
        + "\n  probe: 1\n",
        [doc(probe=1)],
        "kind: List, items: [a document]",
    ),
]


def _code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _cell(value: Any) -> str:
    import json

    if isinstance(value, Refused):
        return f"refused: {_code(value.words)}"
    return ", ".join(_code(json.dumps(_strip(d), ensure_ascii=False)) for d in value) or "nothing"


def _strip(obj: dict[str, Any]) -> Any:
    """What the table shows of a sent object: the probe (or what differs from HEAD)."""
    rest = {k: v for k, v in obj.items() if HEAD_OBJECT.get(k) != v}
    if list(rest) == ["probe"]:
        return rest["probe"]
    return rest or "(the object)"


def typed(value: Any) -> Any:
    """A value with its JSON type made part of it: 2 and 2.0, 1 and True differ."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


def table() -> str:
    from pdmtp.tools.yamlread import ReadError, read_stream

    lines = [
        "## YAML read as kubectl reads it",
        "",
        "Each file, what the pinned kubectl sends the API server for it (its parse: `kubectl "
        "create --dry-run=client --validate=false -o json`), and what `pdmtp validate` reads "
        "(pdmtp.tools.yamlread), which is what it judges. Proven by "
        "tests/unit/test_yaml_read.py (the reader against every row) and "
        "tests/cluster/test_yaml_kubectl.py (every file through the real kubectl).",
        "",
        "| # | case | YAML | kubectl sends | `pdmtp validate` reads |",
        "|---|---|---|---|---|",
    ]
    for i, case in enumerate(CASES, 1):
        try:
            ours: Any = read_stream(case.text)
        except ReadError as e:
            ours = Refused(e.message)
        shown = (case.shown or case.text).replace("|", "\\|").replace("\n", " ")
        read = _cell(ours) + (f"; {case.note}" if case.note else "")
        lines.append(f"| {i} | {case.name} | {_code(shown)} | {_cell(case.sends)} | {read} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
