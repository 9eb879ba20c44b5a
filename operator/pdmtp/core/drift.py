"""Which fields the operator owns differ between what it renders and what lives in the cluster.

The comparison reads the live object as the API server returns it: defaults it filled in (a
container's terminationMessagePath, a Service's clusterIP) and fields others own (an annotation a
tool added, an env var someone appended to a keyed list) are not drift, because a server-side apply
of the rendered manifest would not change them. Anything the rendered manifest sets and the live
object does not match is: an edited image or args, changed replicas, a removed label.

Lists follow server-side apply's merge rules: keyed lists (containers by name, env by name, ...)
compare the rendered elements by key and ignore extra live ones; every other list is atomic and
must match element for element. Resource quantities compare by value (8 == "8", "1.5Gi" ==
"1536Mi").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pdmtp.api.rules import quantity

MERGE_KEYS: Mapping[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "imagePullSecrets": ("name",),
    "ownerReferences": ("uid",),
    # Container ports by containerPort, Service ports by port; NetworkPolicy ports (some
    # without a port) stay atomic because not every element carries the key.
    "ports": ("containerPort", "port"),
}
QUANTITY_MAPS = frozenset({"requests", "limits"})
IDENTITY = frozenset({"name", "namespace"})
"""metadata fields that name the object rather than describe it."""


def drifted(desired: Mapping[str, Any], live: Mapping[str, Any]) -> list[str]:
    """Paths of the fields `desired` sets that `live` does not match (empty: nothing to write)."""
    out: list[str] = []
    for key, want in desired.items():
        if key in ("apiVersion", "kind", "status"):
            continue
        if key == "metadata":
            meta = {k: val for k, val in want.items() if k not in IDENTITY}
            _compare(meta, live.get("metadata") or {}, "metadata", out)
        else:
            _compare(want, live.get(key), key, out)
    return out


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def _compare(want: Any, have: Any, path: str, out: list[str]) -> None:
    if isinstance(want, Mapping):
        if not isinstance(have, Mapping):
            if not _empty(want) or not _empty(have):
                out.append(path)
            return
        quantities = path.rsplit(".", 1)[-1] in QUANTITY_MAPS
        for key, value in want.items():
            sub = f"{path}.{key}"
            if quantities:
                if not _same_quantity(value, have.get(key)):
                    out.append(sub)
            elif key not in have:
                if not _empty(value):
                    out.append(sub)
            else:
                _compare(value, have[key], sub, out)
        return
    if isinstance(want, list):
        if not isinstance(have, list):
            if want or have:
                out.append(path)
            return
        key = _merge_key(path, want)
        if key is None:
            _compare_atomic(want, have, path, out)
        else:
            _compare_keyed(want, have, key, path, out)
        return
    if want != have and not (isinstance(want, int) and str(want) == have):
        out.append(path)


def _merge_key(path: str, want: Sequence[Any]) -> str | None:
    for key in MERGE_KEYS.get(path.rsplit(".", 1)[-1], ()):
        if want and all(isinstance(e, Mapping) and key in e for e in want):
            return key
    return None


def _compare_keyed(
    want: Sequence[Mapping[str, Any]], have: Sequence[Any], key: str, path: str, out: list[str]
) -> None:
    live = {e.get(key): e for e in have if isinstance(e, Mapping)}
    for element in want:
        sub = f"{path}[{element[key]}]"
        if element[key] not in live:
            out.append(sub)
        else:
            _compare(element, live[element[key]], sub, out)


def _compare_atomic(want: Sequence[Any], have: Sequence[Any], path: str, out: list[str]) -> None:
    if len(want) != len(have):
        out.append(path)
        return
    before = len(out)
    for i, (w, h) in enumerate(zip(want, have, strict=True)):
        _compare(w, h, f"{path}[{i}]", out)
    if len(out) > before:
        # An atomic list is replaced whole: report it once, not element by element.
        del out[before:]
        out.append(path)


def _same_quantity(want: Any, have: Any) -> bool:
    if want == have:
        return True
    try:
        return quantity(want) == quantity(have)
    except (TypeError, ValueError):
        return False
