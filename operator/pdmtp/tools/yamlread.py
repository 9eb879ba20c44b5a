"""Read a manifest file as kubectl reads it, so `pdmtp validate` judges the object the API server
would be sent.

kubectl (k8s.io/apimachinery's YAMLOrJSONDecoder) reads a file in three steps, each mirrored
here:

1. A stream whose first non-space character is `{` is JSON (one or more values); anything else
   is YAML, cut into documents at every line that starts with `---` (only spaces or a comment may
   follow it), lexically, before any YAML parsing. Each piece is parsed on its own, and only its
   first YAML document counts (a `...` ends it; anything after is ignored).
2. sigs.k8s.io/yaml reads each piece with its fork of go-yaml v2 into untyped values and turns
   them into JSON: go-yaml v2's scalar resolution (booleans yes/no/on/off/y/n, integers in Go's
   base-prefixed syntax with `_` dropped, floats such as `1e3`, `.5`; timestamps stay strings;
   `1:30` is a string; `!!binary` is decoded), merge keys, aliases, a duplicate key silently
   replacing the earlier value (warned here); map keys become strings; NaN and infinities
   cannot be JSON.
3. kubectl decodes that JSON into an unstructured object: a number written without `.`/`e` that
   fits int64 is an integer, any other number a float64, and sends it on. Go writes an integral
   float below 1e21 with no `.`, so `2.0` reaches the API server as the integer 2.

The result holds only JSON values: dict (str keys), list, str, int (int64), float (finite),
bool, None. Every refusal is a `ReadError` whose message follows kubectl's words where kubectl
has words for it (separators, conversions). Pure: no I/O, no cluster.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from typing import Any

import yaml
from yaml.events import (
    AliasEvent,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1

STR = "tag:yaml.org,2002:str"
INT = "tag:yaml.org,2002:int"
FLOAT = "tag:yaml.org,2002:float"
BOOL = "tag:yaml.org,2002:bool"
NULL = "tag:yaml.org,2002:null"
TIMESTAMP = "tag:yaml.org,2002:timestamp"
BINARY = "tag:yaml.org,2002:binary"
MERGE = "tag:yaml.org,2002:merge"
RESOLVABLE = frozenset({"", STR, BOOL, INT, FLOAT, NULL, TIMESTAMP})

MAX_DEPTH = 200
"""Nesting this deep is refused here (go-yaml allows 10,000 levels; Python's stack does not).
No field of a PDDeployment nests a tenth as deep, so the API server refuses such a file too, in
other words (unknown or mistyped fields)."""
JSON_PREFIX_WINDOW = 4096
"""kubectl guesses JSON from the first bytes it buffers."""


class ReadError(ValueError):
    """The file is not something kubectl would send; the message says why, in kubectl's words
    where it has them; `line` (1-based, in the file once raised by read_stream) where known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line

    def __str__(self) -> str:
        return self.message if self.line is None else f"line {self.line}: {self.message}"


# ---- step 2: go-yaml v2's scalars ----------------------------------------------------------------

_BOOLS = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "on", "On", "ON"), True),
    **dict.fromkeys(("true", "True", "TRUE"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "off", "Off", "OFF"), False),
    **dict.fromkeys(("false", "False", "FALSE"), False),
}
_NULLS = frozenset(("", "~", "null", "Null", "NULL"))
_SPECIAL_FLOATS = {
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
_YAML_STYLE_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?\Z")
# Go's ParseFloat syntax for a decimal (hex floats never reach it here: see _go_parse_float).
_GO_DECIMAL_FLOAT = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?\Z")
_TIMESTAMP_FORMATS = (
    # Go's layouts 2006-1-2T15:4:5.999999999Z07:00 (also with t), "2006-1-2 15:4:5.999999999",
    # 2006-1-2: one- or two-digit month, day, hour, minute, second.
    re.compile(
        r"\d{4}-\d{1,2}-\d{1,2}[Tt]\d{1,2}:\d{1,2}:\d{1,2}(\.\d{1,9})?(Z|[-+]\d{2}:\d{2})\Z"
    ),
    re.compile(r"\d{4}-\d{1,2}-\d{1,2} \d{1,2}:\d{1,2}:\d{1,2}(\.\d{1,9})?\Z"),
    re.compile(r"\d{4}-\d{1,2}-\d{1,2}\Z"),
)


def _hint(value: str) -> str:
    """go-yaml v2's resolveTable: what the first character suggests."""
    if value == "":
        return "N"
    c = value[0]
    if c in "+-":
        return "S"
    if c.isascii() and c.isdigit():
        return "D"
    if c in "yYnNtTfFoO~":
        return "M"
    if c == ".":
        return "."
    return ""


def _go_parse_int(text: str, unsigned: bool) -> int | None:
    """Go's strconv.ParseInt(text, 0, 64) / ParseUint(text, 0, 64): None where Go errs."""
    s, sign = text, 1
    if not unsigned and s[:1] in ("+", "-"):
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    base = 10
    lower = s[:2].lower()
    if lower in ("0x", "0o", "0b"):
        base = {"0x": 16, "0o": 8, "0b": 2}[lower]
        s = s[2:]
    elif len(s) > 1 and s[0] == "0":
        base, s = 8, s[1:]
    digits = "0123456789abcdef"[:base]
    if not s or any(ch not in digits for ch in s.lower()):
        return None
    n = sign * int(s, base)
    if unsigned:
        return n if n <= UINT64_MAX else None
    return n if INT64_MIN <= n <= INT64_MAX else None


def _go_parse_float(text: str) -> float | None:
    """Go's strconv.ParseFloat(text, 64) for the decimal forms go-yaml hands it: None where Go
    errs, overflow (±Inf with ErrRange) included."""
    if not _GO_DECIMAL_FLOAT.match(text):
        return None
    value = float(text)
    return None if math.isinf(value) else value


def _decode_error(rtag: str, value: str, tag: str) -> ReadError:
    return ReadError(f"yaml: cannot decode {_short(rtag)} `{value}` as a {_short(tag)}")


def _short(tag: str) -> str:
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org") else tag


def resolve_scalar(tag: str, value: str) -> tuple[str, Any]:
    """go-yaml v2's resolve(): (resolved tag, value) of a scalar, `tag` "" when untagged."""
    if tag not in RESOLVABLE:
        return tag, value
    rtag, out = _resolve(tag, value)
    if tag in ("", rtag, STR, BINARY):
        return rtag, out
    if tag == FLOAT and rtag == INT:
        return FLOAT, float(out)
    raise _decode_error(rtag, value, tag)


def _resolve(tag: str, value: str) -> tuple[str, Any]:
    hint = _hint(value)
    if not hint or tag in (STR, BINARY):
        return STR, value
    if value in _BOOLS:
        return BOOL, _BOOLS[value]
    if value in _NULLS:
        return NULL, None
    if value in _SPECIAL_FLOATS:
        return FLOAT, _SPECIAL_FLOATS[value]
    if value == "<<":
        return MERGE, value
    if hint == ".":
        f = _go_parse_float(value)
        if f is not None:
            return FLOAT, f
    elif hint in "DS":
        stamp = tag in ("", TIMESTAMP) and any(p.match(value) for p in _TIMESTAMP_FORMATS)
        if stamp and _valid_date(value):
            return TIMESTAMP, value  # into interface{}: the text, as written
        plain = value.replace("_", "")
        for unsigned in (False, True):
            n = _go_parse_int(plain, unsigned) if plain else None
            if n is not None:
                return INT, _Uint(n) if n > INT64_MAX else n
        if _YAML_STYLE_FLOAT.match(plain):
            f = _go_parse_float(plain)
            if f is not None:
                return FLOAT, f
    return STR, value


_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _valid_date(value: str) -> bool:
    """Go's time.Parse also checks the fields' ranges (month 1-12, day within the month, ...)."""
    parts = re.split(r"[-Tt :.Z+]", value)
    year, month, day = (int(p) for p in parts[:3])
    if not 1 <= month <= 12:
        return False
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if not 1 <= day <= (_DAYS[month - 1] if month != 2 or leap else 28):
        return False
    if len(parts) >= 6:
        hour, minute, second = (int(p) for p in parts[3:6])
        if hour > 23 or minute > 59 or second > 59:
            return False
    zone = re.search(r"[-+](\d{2}):(\d{2})\Z", value)
    return not (zone and (int(zone.group(1)) > 23 or int(zone.group(2)) > 59))


def go_string(data: bytes) -> str:
    """Bytes as Go's encoding/json writes a string: each byte of an invalid UTF-8 sequence
    becomes U+FFFD."""
    out: list[str] = []
    i = 0
    while i < len(data):
        lead = data[i]
        width = 1 if lead < 0x80 else 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else 4
        if lead >> 3 == 0x1F or 0x80 <= lead < 0xC0:
            width = 0
        if width:
            try:
                out.append(data[i : i + width].decode("utf-8"))
                i += width
                continue
            except UnicodeDecodeError:
                pass
        out.append("\ufffd")
        i += 1
    return "".join(out)


# ---- step 2: PyYAML's parser and composer, go-yaml v2's resolver and decoder ----------------


class _GoComposer(yaml.composer.Composer, yaml.resolver.BaseResolver):
    """PyYAML's composer as go-yaml v2 composes: an anchor defined again replaces the earlier one,
    an unknown alias is refused in go-yaml's words, and nesting is bounded. A plain scalar keeps
    the tag "" (resolved when decoded, as go-yaml resolves it); a quoted one, or one tagged `!`,
    is a string."""

    depth = 0
    nonspecific = False

    def resolve(self, kind: type, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode:
            return "" if implicit[0] and not self.nonspecific else STR
        return str(super().resolve(kind, value, implicit))  # type: ignore[no-untyped-call]

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[attr-defined]
        if isinstance(event, AliasEvent):
            if event.anchor not in self.anchors:
                raise ReadError(f"yaml: unknown anchor '{event.anchor}' referenced")
        else:
            self.anchors.pop(event.anchor, None)
        self.nonspecific = getattr(event, "tag", None) == "!"
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise ReadError(
                    f"nesting deeper than {MAX_DEPTH} levels", event.start_mark.line + 1
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _Loader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, _GoComposer):
    """PyYAML's own parser under the composer."""

    def __init__(self, text: str) -> None:
        yaml.reader.Reader.__init__(self, text)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        _GoComposer.__init__(self)
        yaml.resolver.BaseResolver.__init__(self)


if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _CLoader(_GoComposer, CParser):
        """libyaml's parser (go-yaml v2 is a port of it) under the composer: the same events as
        PyYAML's own, ten times faster."""

        def __init__(self, text: str) -> None:
            CParser.__init__(self, text)
            _GoComposer.__init__(self)
            yaml.resolver.BaseResolver.__init__(self)


def _first_document(text: str) -> yaml.Node | None:
    """The first document of `text` (go-yaml v2 reads no further); None for an empty stream."""
    loader = _CLoader(text) if yaml.__with_libyaml__ else _Loader(text)
    return loader.get_node() if loader.check_node() else None


def _allowed_alias_ratio(decodes: int) -> float:
    if decodes <= 400_000:
        return 0.99
    if decodes >= 4_000_000:
        return 0.10
    return 0.99 - 0.89 * (decodes - 400_000) / 3_600_000


class _Decoder:
    """go-yaml v2's decoder into interface{}, not strict, as kubectl uses it: a duplicate key
    replaces the earlier value (merged keys too, in document order), and is noted. An alias is
    the anchored node itself (PyYAML's composer shares it), decoded again each time it is met."""

    def __init__(self) -> None:
        self.decodes = 0
        self.aliased = 0  # of those, decoded inside an alias
        self.inside = 0  # aliases being decoded
        self.seen: set[int] = set()  # nodes decoded once: met again, they are aliases
        self.active: set[int] = set()  # nodes being decoded (an alias inside is a cycle)
        self.duplicates: list[tuple[int, str]] = []  # (0-based line, go-yaml's strict words)

    def count(self) -> None:
        """go-yaml v2's guard: nodes decoded inside an alias against all nodes decoded."""
        self.decodes += 1
        self.aliased += self.inside > 0
        ratio = _allowed_alias_ratio(self.decodes)
        if self.aliased > 100 and self.decodes > 1000 and self.aliased / self.decodes > ratio:
            raise ReadError("yaml: document contains excessive aliasing")

    def value(self, n: yaml.Node) -> Any:
        if id(n) in self.active:
            raise ReadError("yaml: anchor value contains itself")
        alias = id(n) in self.seen
        self.seen.add(id(n))
        self.active.add(id(n))
        self.inside += alias
        try:
            self.count()
            if isinstance(n, yaml.ScalarNode):
                return self.scalar(n)
            if isinstance(n, yaml.SequenceNode):
                return [self.value(c) for c in n.value]
            out: dict[Any, Any] = {}
            self.mapping(n, out)
            return out
        finally:
            self.active.discard(id(n))
            self.inside -= alias

    def scalar(self, n: yaml.ScalarNode) -> Any:
        tag, resolved = resolve_scalar(n.tag, n.value)
        if tag == BINARY:
            try:
                data = base64.b64decode(n.value.replace("\n", "").replace("\r", ""), validate=True)
            except (binascii.Error, ValueError):
                raise ReadError("yaml: !!binary value contains invalid base64 data") from None
            return _Bytes(data)
        return resolved

    def mapping(self, n: yaml.Node, out: dict[Any, Any]) -> None:
        for key_node, value_node in n.value:
            if _is_merge(key_node):
                self.merge(value_node, out)
                continue
            key = self.value(key_node)
            if isinstance(key, dict | list):
                raise ReadError(f"yaml: invalid map key: {_go_repr(key)}")
            value = self.value(value_node)
            marker = _key_marker(key)
            if marker in out:
                line = value_node.start_mark.line
                self.duplicates.append((line, f"key {_go_repr(key)} already set in map"))
            out[marker] = value

    def merge(self, n: yaml.Node, out: dict[Any, Any]) -> None:
        maps = n.value if isinstance(n, yaml.SequenceNode) else [n]
        if not all(isinstance(m, yaml.MappingNode) for m in maps):
            raise ReadError("yaml: map merge requires map or sequence of maps as the value")
        for m in reversed(maps):  # earlier maps take precedence
            self.count()
            self.mapping(m, out)


def _is_merge(n: yaml.Node) -> bool:
    return isinstance(n, yaml.ScalarNode) and n.value == "<<" and n.tag in ("", MERGE)


class _Bytes(bytes):
    """A !!binary scalar, decoded (a Go string of these bytes)."""


class _Uint(int):
    """An integer go-yaml v2 holds as uint64 (above int64): no map key can be one."""


class _Key:
    """A map key that is not a string, kept apart from the string of the same text until the
    keys are converted (go-yaml v2 holds 1 and "1" as two keys)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        return hash((type(self.value), self.value))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Key)
            and type(other.value) is type(self.value)
            and other.value == self.value
        )


def _key_marker(key: Any) -> Any:
    if isinstance(key, _Bytes):  # a Go string like any other
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            return _Key(key)
    return key if type(key) is str else _Key(key)


def _go_repr(value: Any) -> str:
    """A key as go-yaml v2's messages show it: a string quoted, anything else as written."""
    if isinstance(value, _Key):
        return _go_repr(value.value)
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


# ---- step 2: sigs.k8s.io/yaml's JSON, step 3: kubectl's unstructured object ----------------------


def _float32(value: float) -> float:
    """Go's float32(value): rounded to single precision, ±Inf beyond its range."""
    try:
        rounded: float = struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)
    return rounded


def _float32_key(value: float) -> str:
    """A float map key as sigs.k8s.io/yaml writes it: strconv.FormatFloat(value, 'g', -1, 32),
    the shortest digits that read back as the same float32, with an exponent outside 1e-4 to
    1e6; infinities and NaN in YAML's words."""
    single = _float32(value)
    if not math.isfinite(single):
        return ".nan" if math.isnan(single) else ".inf" if single > 0 else "-.inf"
    if single == 0:
        return "-0" if math.copysign(1.0, single) < 0 else "0"
    text = next(t for p in range(9) if _float32(float(t := f"{single:.{p}e}")) == single)
    mantissa, exponent = text.split("e")
    sign = "-" if mantissa.startswith("-") else ""
    digits, exp = mantissa.lstrip("-").replace(".", ""), int(exponent)
    if exp < -4 or exp >= 6:
        point = "." + digits[1:] if len(digits) > 1 else ""
        return f"{sign}{digits[0]}{point}e{exponent[0]}{abs(exp):02d}"
    if exp < 0:
        return f"{sign}0.{'0' * (-exp - 1)}{digits}"
    whole, frac = digits[: exp + 1].ljust(exp + 1, "0"), digits[exp + 1 :]
    return sign + whole + ("." + frac if frac else "")


def _json_key(key: Any) -> str:
    """sigs.k8s.io/yaml's map key conversion."""
    if type(key) is str:
        return key
    value = key.value if isinstance(key, _Key) else key
    if isinstance(value, _Bytes):
        return go_string(value)
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and not isinstance(value, _Uint):
        return str(value)
    if isinstance(value, float):
        return _float32_key(value)
    kind = "uint64" if isinstance(value, _Uint) else "%!s(<nil>)"
    raise ReadError(f"error converting YAML to JSON: unsupported map key of type: {kind}")


def _number(value: int | float) -> int | float:
    """A number as kubectl's unstructured object holds it after the JSON round trip: what Go
    writes without `.` or `e` and fits int64 is an int, anything else a float64."""
    if isinstance(value, int):
        return value if INT64_MIN <= value <= INT64_MAX else float(value)
    if math.isnan(value) or math.isinf(value):
        raise ReadError(
            "error converting YAML to JSON: json: unsupported value: "
            + ("NaN" if math.isnan(value) else "+Inf" if value > 0 else "-Inf")
        )
    if value.is_integer() and abs(value) < 1e21 and INT64_MIN <= value <= INT64_MAX:
        return int(value)
    return value


def to_json_value(value: Any) -> Any:
    """A decoded YAML value as kubectl sends it (see the module docstring, steps 2-3)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            # Keys that read apart in YAML may write alike (1 and "1"): Go keeps one of them.
            out[_json_key(key)] = to_json_value(item)
        return out
    if isinstance(value, list):
        return [to_json_value(item) for item in value]
    if isinstance(value, _Bytes):
        return go_string(value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return _number(value)
    raise AssertionError(f"not a decoded YAML value: {type(value).__name__}")


# ---- step 1: the stream -------------------------------------------------------------------------


def _go_lines(text: str) -> list[str]:
    """bufio.Reader.ReadLine as kubectl's LineReader uses it: split at "\n" only, a "\r" before
    it dropped, every line given back with "\n"."""
    parts = text.split("\n")
    if parts[-1] == "":
        parts.pop()  # the text ended with a newline
        return [p.removesuffix("\r") + "\n" for p in parts]
    return [p.removesuffix("\r") + "\n" for p in parts[:-1]] + [parts[-1] + "\n"]


def split_documents(text: str) -> list[tuple[int, str]]:
    """kubectl's YAMLReader: (first line number, text) of each piece between `---` lines."""
    pieces: list[tuple[int, str]] = []
    buffer: list[str] = []
    start = 1
    for number, line in enumerate(_go_lines(text), 1):
        if line.startswith("---"):
            rest = line[3:].strip(" \t\n\r\v\f\x85\xa0")
            if rest and not rest.startswith("#"):
                raise ReadError(f"invalid Yaml document separator: {rest}", number)
            if buffer:
                pieces.append((start, "".join(buffer)))
                buffer = []
            continue
        if not buffer:
            start = number
        buffer.append(line)
    if buffer:
        pieces.append((start, "".join(buffer)))
    return pieces


def read_yaml_piece(text: str, notes: list[tuple[int, str]] | None = None) -> Any:
    """One piece of a YAML stream as kubectl's JSON value (None for an empty piece); each
    duplicate key goes to `notes` as (1-based line in the piece, go-yaml's strict words)."""
    try:
        root = _first_document(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        line = mark.line + 1 if mark is not None else None
        raise ReadError(f"yaml: {e.problem}", line) from None
    except yaml.YAMLError as e:
        raise ReadError(f"yaml: {e}") from None
    if root is None:
        return None
    decoder = _Decoder()
    try:
        value = decoder.value(root)
    except RecursionError:
        raise ReadError("error converting YAML to JSON: yaml: nesting too deep") from None
    except ReadError as e:
        raise ReadError(f"error converting YAML to JSON: {e.message}", e.line) from None
    if notes is not None:
        notes += [(line + 1, words) for line, words in decoder.duplicates]
    try:
        return to_json_value(value)
    except RecursionError:
        raise ReadError("error converting YAML to JSON: nesting too deep") from None


def _json_number(text: str) -> int | float:
    if not any(c in text for c in ".eE"):
        n = int(text)
        if INT64_MIN <= n <= INT64_MAX:
            return n
    value = float(text)
    if math.isinf(value):
        raise ReadError(f"json: cannot unmarshal number {text} into Go value of type float64")
    return _number(value)


def _json_constant(name: str) -> Any:
    raise ReadError(f"invalid character '{name[0]}' looking for beginning of value")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_strings(value: Any) -> Any:
    """Go's JSON decoder reads a lone surrogate escape as U+FFFD."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_json_strings(v) for v in value]
    if isinstance(value, dict):
        return {_json_strings(k): _json_strings(v) for k, v in value.items()}
    return value


def read_json_then_yaml(
    text: str, yaml_after: bool = True, warnings: list[str] | None = None
) -> list[Any]:
    """kubectl's JSON path: JSON values one after another; where one does not parse and at most
    one did before, the rest (from the end of the last one, the spaces up to the first newline
    skipped) is read as YAML, and if that fails too the JSON error is the one reported."""
    decoder = json.JSONDecoder(
        parse_int=_json_number, parse_float=_json_number, parse_constant=_json_constant
    )
    values: list[Any] = []
    consumed = 0
    while True:
        i = consumed
        while i < len(text) and text[i] in _JSON_SPACE:
            i += 1
        if i == len(text):
            return values
        try:
            value, consumed = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            error = ReadError(f"json: {e.msg}", e.lineno)
            if len(values) > 1 or not yaml_after:
                raise error from None
            break
        except RecursionError:
            raise ReadError(f"nesting deeper than {MAX_DEPTH} levels") from None
        if _depth(value) > MAX_DEPTH:
            raise ReadError(f"nesting deeper than {MAX_DEPTH} levels")
        values.append(_json_strings(value))
    rest = consumed
    while rest < len(text) and text[rest].isspace():
        rest += 1
        if text[rest - 1] == "\n":
            break
    try:
        more = _read_yaml(text[rest:], text[:rest].count("\n") + 1, warnings)
    except ReadError:
        raise error from None
    return values + more


_JSON_SPACE = " \t\r\n"


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, level + 1)
            stack.extend(
                (v, level + 1) for v in (node.values() if isinstance(node, dict) else node)
            )
    return deepest


def _read_yaml(text: str, first_line: int = 1, warnings: list[str] | None = None) -> list[Any]:
    values = []
    for start, piece in split_documents(text):
        notes: list[tuple[int, str]] = []
        try:
            values.append(read_yaml_piece(piece, notes))
        except ReadError as e:
            line = start if e.line is None else start + e.line - 1
            raise ReadError(e.message, line + first_line - 1) from None
        if warnings is not None:
            for line, words in notes:
                at = start + line - 1 + first_line - 1
                warnings.append(f"line {at}: {words} (kubectl keeps the last)")
    return values


def looks_like_json(text: str) -> bool:
    return text[:JSON_PREFIX_WINDOW].lstrip().startswith("{")


def read_bytes(data: bytes, warnings: list[str] | None = None) -> list[Any]:
    """A file's bytes as kubectl reads them. Bytes that are not UTF-8 are no error, in JSON or
    YAML: each becomes U+FFFD in what kubectl sends (go-yaml v2 passes them through, Go's JSON
    writes U+FFFD); control characters are refused, as go-yaml refuses them."""
    return read_stream(go_string(data), warnings)


def read_stream(text: str, warnings: list[str] | None = None) -> list[Any]:
    """Every object kubectl would send for this file's text, in order; empty and null documents
    are skipped, as kubectl skips them. Raises ReadError. A duplicate key is no error (kubectl
    keeps the last value without a word): `warnings` gets a line for each."""
    if looks_like_json(text):
        values = read_json_then_yaml(text, warnings=warnings)
    else:
        values = _read_yaml(text, warnings=warnings)
    return [item for v in values if v is not None for item in _flatten(v)]


def _flatten(value: Any) -> list[Any]:
    """kubectl's unstructured decoding takes any object with `items` for a list, and sends each
    item (given the list's apiVersion and kind less `List` when it names neither)."""
    if not isinstance(value, dict) or value.get("items") is None:
        return [value]
    items = value["items"]
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ReadError("json: cannot unmarshal items into Go value of type []map[string]any")
    out = []
    for item in items:
        if "kind" not in item and "apiVersion" not in item:
            kind = value.get("kind")
            item = {
                **item,
                "kind": kind.removesuffix("List") if isinstance(kind, str) else kind,
                "apiVersion": value.get("apiVersion"),
            }
        out.append(item)
    return out


# ---- what the API server does with null ----------------------------------------------------------


def drop_nulls(value: Any, schema: dict[str, Any]) -> Any:
    """`value` as a custom resource's structural `schema` leaves it before validation: a null map
    value is dropped unless the schema marks that field nullable (the PDDeployment has no such
    field), so a default applies as if the key were absent; even under a key the schema does not
    know, strict field validation then has nothing to refuse (kubectl apply
    --validate=strict takes `replicaz: ~`). A null list item stays: the schema refuses it."""
    if isinstance(value, list):
        items = schema.get("items")
        return [drop_nulls(v, items if isinstance(items, dict) else {}) for v in value]
    if not isinstance(value, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    props: dict[str, Any] = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    out: dict[str, Any] = {}
    for key, item in value.items():
        sub = props.get(key, extra if isinstance(extra, dict) else {})
        if item is not None:
            out[key] = drop_nulls(item, sub)
        elif sub.get("nullable"):
            out[key] = item
    return out


# ---- JSON shape ----------------------------------------------------------------------------------


def json_problems(value: Any, path: str = "") -> list[str]:
    """Where `value` holds something that is not a JSON value (a date, bytes, a tuple, NaN, a
    non-string key): one line per place, naming the field. Empty when it is all JSON."""
    where = path or "(document)"
    if value is None or isinstance(value, bool | str):
        return []
    if isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return []
        return [f"{where}: integer {value} is out of the int64 range"]
    if isinstance(value, float):
        return [] if math.isfinite(value) else [f"{where}: {value} is not a JSON number"]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in json_problems(item, f"{path}[{i}]")]
    if isinstance(value, dict):
        out: list[str] = []
        for key, item in value.items():
            if not isinstance(key, str):
                out.append(f"{where}: key {key!r} is a {type(key).__name__}, not a string")
                continue
            out += json_problems(item, f"{path}.{key}" if path else key)
        return out
    return [f"{where}: a {type(value).__name__} is not a JSON value"]


def to_json_bytes(value: Any) -> bytes:
    """The bytes sent to the API server for a value read here."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
