#!/usr/bin/env python3
"""Build the operator, router and engine images with podman, on locally made bases.

    hack/lib/build_images.py build [KEY ...]   build what is missing or stale (default: all)
    hack/lib/build_images.py names             KEY=IMAGE lines: the names other scripts use
    hack/lib/build_images.py report            size, image ID and digest of each, as JSON
    hack/lib/build_images.py build-tree DIR --revision REV
                        the operator image of another source tree (a release's `git archive`),
                        built as the current one; named localhost/pdmtp-operator:<DIR's
                        version>-<REV>, so it never takes the current tag; prints the name

No registry is reachable where this runs, so the Dockerfiles' upstream bases are replaced
through their base-image build args by local equivalents (images/base/): a bookworm + CPython
3.11 rootfs made with mmdebstrap, and on it the same vLLM release from PyPI that the upstream vLLM
image carries. The published Dockerfiles keep their upstream base defaults; the versions they
install are build args, passed from versions.env.

Caching: every image carries the label io.pdmtp.inputs, a hash of what it is built from (its
Dockerfile, the files its context copies, its build args, and its base's hash). An image whose
label matches is not rebuilt, so a warm run only hashes files; a pin or source change rebuilds
that image and what is built on it. Replaced images and stale build cache are removed.

Builds use the host network (PyPI and the Debian mirror; nothing listens) and, when the host has
one, its CA bundle bind-mounted read-only over the image's, so a TLS-intercepting egress proxy
works; the mount never reaches a layer. The engine base bind-mounts the host's uv cache, which
hack/engine-venv.sh fills with the same torch and CUDA wheels, so they are not downloaded twice.
Only the standard library (and versions.py beside it): runs with any python3 >= 3.11.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from versions import read_versions

REPO: Final = Path(__file__).resolve().parents[2]
INPUTS_LABEL: Final = "io.pdmtp.inputs"
HOST_CA_BUNDLE: Final = Path("/etc/ssl/certs/ca-certificates.crt")
UV_CACHE_IN_BUILD: Final = "/root/.cache/uv"
# vLLM's dependency resolution is frozen at this instant, so the engine base rebuilds to the
# same set of wheels; move it forward deliberately (it is part of the base's input hash).
UV_EXCLUDE_NEWER: Final = "2026-11-30T00:00:00Z"
# The vLLM base writes about 10 GB and briefly needs room for the layer it commits: free space
# fell by 20 GB at the peak of its build and settled 10 GB lower.
MIN_FREE_BYTES_FOR_VLLM_BASE: Final = 24 * 2**30
SKIPPED_PARTS: Final = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"})


class BuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("PDMTP_CACHE_DIR", Path.home() / ".cache" / "pdmtp"))


@dataclass(frozen=True)
class Versions:
    """Every version an image name or build arg carries: the project's own from pyproject.toml,
    the rest from versions.env."""

    operator: str
    router: str
    vllm: str
    mooncake: str
    uv: str

    @classmethod
    def read(cls) -> Versions:
        project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        pins = read_versions()
        return cls(
            operator=str(project["version"]),
            router=pins["VLLM_ROUTER_VERSION"],
            vllm=pins["VLLM_VERSION"],
            mooncake=pins["MOONCAKE_VERSION"],
            # The uv of the test venvs, which fill the host's uv cache: its wheels are reused.
            uv=pins["UV_VERSION"],
        )


@dataclass(frozen=True)
class ImageSpec:
    """One image: how it is built and what decides its content."""

    key: str
    name: str
    inputs: tuple[Path, ...]
    """Files and directories (walked) whose bytes go into the image."""
    base: str | None = None
    """Key of the local image it is built FROM, passed as `base_arg`."""
    base_arg: str | None = None
    build_args: Mapping[str, str] = field(default_factory=dict)
    containerfile: Path | None = None
    context: Path | None = None
    ignorefile: Path | None = None
    script: Path | None = None
    """Built by running this script with the name and label (instead of `podman build`)."""
    uv_cache: bool = False
    root: Path = REPO
    """The source tree the input hash names `inputs` relative to."""


def operator_spec(root: Path, name: str, version: str) -> ImageSpec:
    """The operator image of the source tree at `root` (this repository, or a release's)."""
    return ImageSpec(
        key="operator",
        name=name,
        # What images/operator/Dockerfile.dockerignore lets into the context.
        inputs=(
            root / "images/operator/Dockerfile",
            root / "images/operator/Dockerfile.dockerignore",
            root / "pyproject.toml",
            root / "README.md",
            root / "operator",
        ),
        base="base-python",
        base_arg="PYTHON_IMAGE",
        build_args={"PDMTP_VERSION": version},
        containerfile=root / "images/operator/Dockerfile",
        context=root,
        ignorefile=root / "images/operator/Dockerfile.dockerignore",
        root=root,
    )


def tree_version(root: Path) -> str:
    """The pdmtp version of a source tree (its pyproject.toml)."""
    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


def specs(versions: Versions | None = None) -> dict[str, ImageSpec]:
    """Every image in build order: a base before what is built on it."""
    v = versions or Versions.read()
    engine = REPO / "images/engine"
    return {
        spec.key: spec
        for spec in (
            ImageSpec(
                key="base-python",
                name="localhost/pdmtp-base-python:3.11-bookworm",
                inputs=(REPO / "images/base/python/build.sh",),
                script=REPO / "images/base/python/build.sh",
            ),
            ImageSpec(
                key="base-vllm",
                name=f"localhost/pdmtp-base-vllm-openai:{v.vllm}",
                inputs=(REPO / "images/base/vllm-openai/Containerfile",),
                base="base-python",
                base_arg="PYTHON_IMAGE",
                build_args={
                    "VLLM_VERSION": v.vllm,
                    "UV_VERSION": v.uv,
                    "UV_EXCLUDE_NEWER": UV_EXCLUDE_NEWER,
                },
                containerfile=REPO / "images/base/vllm-openai/Containerfile",
                context=REPO / "images/base/vllm-openai",
                uv_cache=True,
            ),
            operator_spec(REPO, f"localhost/pdmtp-operator:{v.operator}", v.operator),
            ImageSpec(
                key="router",
                name=f"localhost/pdmtp-router:{v.router}",
                inputs=(REPO / "images/router",),
                base="base-python",
                base_arg="PYTHON_IMAGE",
                containerfile=REPO / "images/router/Dockerfile",
                context=REPO / "images/router",
            ),
            ImageSpec(
                key="engine",
                name=f"localhost/pdmtp-engine:{v.vllm}",
                inputs=(engine,),
                base="base-vllm",
                base_arg="BASE_IMAGE",
                build_args={"VLLM_VERSION": v.vllm, "MOONCAKE_VERSION": v.mooncake},
                containerfile=engine / "Dockerfile",
                context=engine,
                ignorefile=engine / ".dockerignore",
            ),
        )
    }


PRODUCT_IMAGES: Final = ("operator", "router", "engine")


def _files(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                rel = child.relative_to(path)
                if (
                    child.is_file()
                    and not SKIPPED_PARTS.intersection(rel.parts)
                    and child.suffix != ".pyc"
                    and not any(part.endswith(".egg-info") for part in rel.parts)
                ):
                    yield child
        elif path.is_file():
            yield path
        else:
            raise BuildError(f"input {path} does not exist")


def input_hash(spec: ImageSpec, all_specs: Mapping[str, ImageSpec]) -> str:
    digest = hashlib.sha256()
    digest.update(f"{spec.key}\n{spec.name}\n".encode())
    for name, value in sorted(spec.build_args.items()):
        digest.update(f"arg {name}={value}\n".encode())
    for path in _files(spec.inputs):
        content = hashlib.sha256(path.read_bytes()).hexdigest()
        mode = "x" if os.access(path, os.X_OK) else "-"
        digest.update(f"file {path.relative_to(spec.root)} {mode} {content}\n".encode())
    if spec.base is not None:
        digest.update(f"base {input_hash(all_specs[spec.base], all_specs)}\n".encode())
    return digest.hexdigest()[:16]


# ---- podman ------------------------------------------------------------------------------


def podman_environ() -> dict[str, str]:
    """os.environ plus what hack/podman-env.sh exports (it installs podman if missing)."""
    out = subprocess.run(
        ["bash", str(REPO / "hack/podman-env.sh")], check=True, capture_output=True, text=True
    ).stdout
    env = dict(os.environ)
    for line in out.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, value = words[1].split("=", 1)
            env[name] = value
    if "CONTAINERS_CONF" not in env:
        raise BuildError(f"hack/podman-env.sh exported no CONTAINERS_CONF: {out!r}")
    return env


def inspect(name: str, env: Mapping[str, str]) -> dict[str, Any] | None:
    result = subprocess.run(
        ["podman", "image", "inspect", name], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        return None
    (info,) = json.loads(result.stdout)
    return dict(info)


def prune_stale_build_cache(current: set[str], env: Mapping[str, str]) -> int:
    """Remove what earlier builds of these images left behind; returns how many images went.

    Every image and build-cache image these builds make carries INPUTS_LABEL (set by the build,
    or inherited from a local base). A replaced image, or a build step nothing is built on any
    more, is dangling: untagged and nobody's parent. Those whose label is not a current input
    hash are removed, repeatedly, since removing one can leave its parent dangling. Cache that a
    current image rests on is never dangling, and podman refuses to remove an image a container
    uses, so nothing in use goes.
    """
    removed = 0
    refused: set[str] = set()
    while True:
        listed = subprocess.run(
            [
                "podman",
                "images",
                "--all",
                "--filter=dangling=true",
                f"--filter=label={INPUTS_LABEL}",
                "--format=json",
            ],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        ).stdout
        stale = [
            str(image["Id"])
            for image in json.loads(listed or "[]")
            if (image.get("Labels") or {}).get(INPUTS_LABEL) not in current
            and image["Id"] not in refused
        ]
        if not stale:
            return removed
        for image_id in stale:
            done = subprocess.run(["podman", "rmi", image_id], capture_output=True, env=env)
            if done.returncode == 0:
                removed += 1
            else:
                refused.add(image_id)


def _graph_root(env: Mapping[str, str]) -> Path:
    out = subprocess.run(
        ["podman", "info", "--format", "{{.Store.GraphRoot}}"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()
    return Path(out)


def _run_logged(cmd: list[str], log_path: Path, env: Mapping[str, str]) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
        result = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if result.returncode != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-40:])
        raise BuildError(f"{shlex.join(cmd[:3])}... exited {result.returncode}:\n{tail}")


def build_command(
    spec: ImageSpec, all_specs: Mapping[str, ImageSpec], label: str, uv_cache: Path
) -> list[str]:
    if spec.script is not None:
        return ["bash", str(spec.script), spec.name, f"{INPUTS_LABEL}={label}"]
    assert spec.containerfile is not None and spec.context is not None
    cmd = [
        "podman",
        "build",
        "--pull=never",  # a base must be local: nothing can be pulled here
        "--network=host",
        "--layers",
        "--label",
        f"{INPUTS_LABEL}={label}",
        "--file",
        str(spec.containerfile),
        "--tag",
        spec.name,
    ]
    args = dict(spec.build_args)
    if spec.base is not None and spec.base_arg is not None:
        args[spec.base_arg] = all_specs[spec.base].name
    for name, value in sorted(args.items()):
        cmd += ["--build-arg", f"{name}={value}"]
    if spec.ignorefile is not None:
        cmd += ["--ignorefile", str(spec.ignorefile)]
    if HOST_CA_BUNDLE.is_file():
        cmd += ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
    if spec.uv_cache:
        cmd += ["--volume", f"{uv_cache}:{UV_CACHE_IN_BUILD}"]
    return [*cmd, str(spec.context)]


@contextmanager
def _build_lock() -> Iterator[None]:
    # Two `make images` at once (another tier, a second shell) would build the same tags twice.
    path = cache_dir() / "images" / "build.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Held; if by the background builds (niced), lift them while this waits.
            lift = REPO / "hack" / "lift-prebuild.sh"
            subprocess.run([str(lift), str(path), "the image builds"], check=False)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _with_bases(keys: Iterable[str], all_specs: Mapping[str, ImageSpec]) -> list[str]:
    wanted: set[str] = set()
    for key in keys:
        while key is not None:
            wanted.add(key)
            key = all_specs[key].base  # type: ignore[assignment]
    return [key for key in all_specs if key in wanted]


def build(keys: Iterable[str], *, force: bool = False) -> dict[str, str]:
    """Build each image (and its bases) unless its label says it is current; returns results.

    `force` rebuilds the named images, never their bases (the vLLM one takes minutes)."""
    keys = list(keys)
    all_specs = specs()
    env = podman_environ()
    results: dict[str, str] = {}
    with _build_lock():
        for key in _with_bases(keys, all_specs):
            results[key] = _build_one(all_specs[key], all_specs, env, force=force and key in keys)
        if any(result != "up to date" for result in results.values()):
            _prune(all_specs, env)
    return results


def build_tree(root: Path, revision: str) -> str:
    """Build the operator image of the source tree `root` (a release's `git archive`) exactly as
    the current one is built: its own Dockerfile and ignore file, on the same local base, cached
    by its input label. Named localhost/pdmtp-operator:<its version>-<revision>, so it never
    takes the current image's tag. Returns the name."""
    root = root.resolve()
    if not (root / "images/operator/Dockerfile").is_file():
        raise BuildError(f"{root} has no images/operator/Dockerfile: not a pdmtp source tree")
    version = tree_version(root)
    spec = operator_spec(root, f"localhost/pdmtp-operator:{version}-{revision}", version)
    all_specs = specs()
    env = podman_environ()
    with _build_lock():
        bases = _with_bases([spec.base or ""], all_specs)
        results = [_build_one(all_specs[key], all_specs, env) for key in bases]
        results.append(_build_one(spec, all_specs, env))
        if any(result != "up to date" for result in results):
            _prune(all_specs, env, also=[spec])
    return spec.name


def _build_one(
    spec: ImageSpec, all_specs: Mapping[str, ImageSpec], env: Mapping[str, str], force: bool = False
) -> str:
    """Build one image unless its label says it is current (or `force`); says what it did."""
    uv_cache = Path(os.environ.get("UV_CACHE_DIR", Path.home() / ".cache" / "uv"))
    label = input_hash(spec, all_specs)
    current = inspect(spec.name, env)
    if not force and current is not None and current.get("Labels", {}).get(INPUTS_LABEL) == label:
        print(f"images: {spec.name} up to date ({label})", file=sys.stderr)
        return "up to date"
    if spec.uv_cache:
        uv_cache.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(_graph_root(env)).free
        if free < MIN_FREE_BYTES_FOR_VLLM_BASE:
            raise BuildError(
                f"{spec.name} needs {MIN_FREE_BYTES_FOR_VLLM_BASE / 2**30:.0f} GiB free "
                f"in podman's storage; {free / 2**30:.1f} GiB left"
            )
    # Another tree's image logs under its tag, beside (not over) the current one's.
    log_name = spec.key if spec.root == REPO else f"{spec.key}-{spec.name.rsplit(':', 1)[-1]}"
    log_path = cache_dir() / "images" / "logs" / f"{log_name}.log"
    print(f"images: building {spec.name} ({label}), log {log_path}", file=sys.stderr)
    started = time.monotonic()
    _run_logged(build_command(spec, all_specs, label, uv_cache), log_path, env)
    elapsed = time.monotonic() - started
    built = inspect(spec.name, env)
    if built is None or built.get("Labels", {}).get(INPUTS_LABEL) != label:
        raise BuildError(f"{spec.name} is missing or unlabelled after its build")
    print(f"images: {spec.name} built in {elapsed:.0f}s", file=sys.stderr)
    return f"built in {elapsed:.0f}s"


def _prune(
    all_specs: Mapping[str, ImageSpec], env: Mapping[str, str], also: Iterable[ImageSpec] = ()
) -> None:
    """Remove stale build cache, keeping what the current images (and `also`) rest on."""
    current_hashes = {input_hash(spec, all_specs) for spec in [*all_specs.values(), *also]}
    pruned = prune_stale_build_cache(current_hashes, env)
    print(f"images: removed {pruned} replaced or stale build-cache images", file=sys.stderr)


def report(keys: Iterable[str]) -> list[dict[str, Any]]:
    all_specs = specs()
    env = podman_environ()
    rows: list[dict[str, Any]] = []
    for key in keys:
        spec = all_specs[key]
        info = inspect(spec.name, env)
        rows.append(
            {
                "key": key,
                "name": spec.name,
                "present": info is not None,
                "id": None if info is None else info["Id"],
                "digest": None if info is None else info.get("Digest"),
                "size_bytes": None if info is None else info.get("Size"),
                "inputs": None if info is None else info.get("Labels", {}).get(INPUTS_LABEL),
                "current": info is not None
                and info.get("Labels", {}).get(INPUTS_LABEL) == input_hash(spec, all_specs),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="build_images.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="build missing or stale images and their bases")
    p_build.add_argument("keys", nargs="*", metavar="KEY", help=", ".join(specs()))
    p_build.add_argument("--force", action="store_true", help="rebuild even if current")
    sub.add_parser("names", help="KEY=IMAGE for every image")
    p_report = sub.add_parser("report", help="ID, digest and size of every image (JSON)")
    p_report.add_argument("keys", nargs="*", metavar="KEY")
    p_tree = sub.add_parser(
        "build-tree", help="the operator image of another source tree; prints its name"
    )
    p_tree.add_argument("tree", type=Path, metavar="DIR")
    p_tree.add_argument("--revision", required=True, help="its short commit: the tag's suffix")
    args = parser.parse_args(argv)
    unknown = sorted(set(getattr(args, "keys", [])) - set(specs()))
    if unknown:
        parser.error(f"unknown image key(s) {', '.join(unknown)}; expected {', '.join(specs())}")

    try:
        if args.command == "names":
            for key, spec in specs().items():
                print(f"{key}={spec.name}")
        elif args.command == "build":
            build(args.keys or PRODUCT_IMAGES, force=args.force)
        elif args.command == "build-tree":
            print(build_tree(args.tree, args.revision))
        else:
            print(json.dumps(report(args.keys or list(specs())), indent=2))
    except BuildError as error:
        print(f"images: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
