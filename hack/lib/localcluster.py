#!/usr/bin/env python3
"""A real, local Kubernetes control plane for tests and the demo, without Docker.

Runs etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK (fake kubelets) as
plain processes on 127.0.0.1, envtest style, from binaries built by hack/build-cluster-bins.sh.
Fake GPU nodes are registered and KWOK drives their pods with the stages in hack/kwok/; they
are split into two racks (label RACK_LABEL). The Workload API (scheduling.k8s.io Workload and
PodGroup, gang and topology-aware scheduling) is switched on where the version has it: see
workload_api().

    python hack/lib/localcluster.py up [--dir .cluster] [--nodes 4] [--foreground]
    python hack/lib/localcluster.py status [--dir .cluster]
    python hack/lib/localcluster.py down [--dir .cluster] [--purge]

In-process use (the test fixtures) starts a guard process that stops the components as soon as
the process that started them is gone, however it ended.

It runs with the project's venv (psutil supervises the processes, cryptography makes the
throw-away PKI). Network rule: every server binds 127.0.0.1 and every request goes to
127.0.0.1. Pod and Service IPs are fake private addresses that nothing may dial.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import functools
import ipaddress
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psutil
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from loopback import LOOPBACK, free_ports
from versions import read_versions

# The pin hack/build-cluster-bins.sh builds (PDMTP_K8S_VERSION overrides it there and here).
K8S_VERSION = read_versions()["K8S_VERSION"]
KWOK_STAGE_DIR = Path(__file__).resolve().parents[2] / "hack" / "kwok"
# Start order; teardown runs in reverse so nothing loses its apiserver before it stops.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
BINARIES = (*COMPONENTS, "kubectl")
# Fake address ranges: private, never routed here, never dialled.
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
NODE_SELECTOR_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
GPU_RESOURCE = "nvidia.com/gpu"
RDMA_RESOURCE = "rdma/hca_shared_devices_a"
PORTS = ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok")
# The fake GPU nodes' rack: the first half of the nodes are in rack-a, the rest in rack-b (a
# PodGroup's spec.schedulingConstraints.topology key for "all members in one rack").
RACK_LABEL: Final = "topology.pdmtp.io/rack"


class ClusterError(RuntimeError):
    """The local control plane could not be started or reached."""


@dataclass(frozen=True)
class WorkloadAPI:
    """How one Kubernetes minor version serves the Workload API (see workload_api)."""

    feature_gates: tuple[str, ...]  # set to true on kube-apiserver, -scheduler, -controller-manager
    version: str  # the scheduling.k8s.io version serving workloads and podgroups

    @property
    def group_version(self) -> str:
        return f"scheduling.k8s.io/{self.version}"

    @property
    def feature_gates_flag(self) -> str:
        return "--feature-gates=" + ",".join(f"{gate}=true" for gate in self.feature_gates)

    @property
    def runtime_config_flag(self) -> str:
        """kube-apiserver only: alpha and beta API versions are off by default."""
        return f"--runtime-config={self.group_version}=true"


def workload_api(version: str = K8S_VERSION) -> WorkloadAPI | None:
    """The feature gates and the scheduling.k8s.io version that serve the Workload API (Workload,
    PodGroup; gang and topology-aware scheduling of pods naming a group in
    spec.schedulingGroup.podGroupName) on Kubernetes `version`, or None where this project does
    not switch it on (older versions had a different pod field; newer ones need a row here).

    Read from k8s.io/kubernetes pkg/features/kube_features.go and pkg/controlplane/instance.go:
    - 1.36: GenericWorkload and GangScheduling (alpha since 1.35), TopologyAwareWorkloadScheduling
      (alpha 1.36); API scheduling.k8s.io/v1alpha2.
    - 1.37: GangScheduling is folded into GenericWorkload (beta, still off by default) and no
      longer exists; a binary given a gate it does not know refuses to start.
      TopologyAwareWorkloadScheduling stays alpha. API scheduling.k8s.io/v1beta1 (v1alpha2 is
      gone; v1beta1 is in betaAPIGroupVersionsDisabledByDefault, hence --runtime-config too).
    """
    table = {
        36: WorkloadAPI(
            ("GenericWorkload", "GangScheduling", "TopologyAwareWorkloadScheduling"), "v1alpha2"
        ),
        37: WorkloadAPI(("GenericWorkload", "TopologyAwareWorkloadScheduling"), "v1beta1"),
    }
    minor = re.match(r"v?1\.(\d+)\.", version)
    if minor is None:
        raise ValueError(f"not a Kubernetes 1.x version: {version!r}")
    return table.get(int(minor[1]))


def rack_of(index: int, count: int) -> str:
    """The rack of fake GPU node `index` of `count`: the first half rack-a, the rest rack-b."""
    return "rack-a" if index < (count + 1) // 2 else "rack-b"


def cache_dir() -> Path:
    return Path(os.environ.get("PDMTP_CACHE_DIR") or Path.home() / ".cache" / "pdmtp")


def default_bin_dir(version: str = K8S_VERSION) -> Path:
    return cache_dir() / "bin" / version


def missing_binaries(bin_dir: Path | None = None) -> list[str]:
    """Names of the required binaries that are not built yet (empty when all are there)."""
    where = bin_dir or default_bin_dir()
    return [name for name in BINARIES if not os.access(where / name, os.X_OK)]


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def make_pki(pki: Path) -> None:
    """A throw-away CA, a loopback serving cert, the admin client cert and service-account keys."""
    pki.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=3650))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("pdmtp-local-ca")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
        .sign(ca_key, hashes.SHA256())
    )
    (pki / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(pki / "ca.key", ca_key)

    def issue(
        name: str, subject: x509.Name, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]
    ) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid[0])
            .not_valid_after(valid[1])
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        (pki / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pki / f"{name}.key", key)

    server_names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    issue(
        "serving",
        _name("pdmtp-local-apiserver"),
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.IPAddress(ipaddress.ip_address(LOOPBACK)), *map(x509.DNSName, server_names)],
    )
    # system:masters is the group RBAC always allows, like envtest's admin user.
    issue("admin", _name("admin", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH, [])
    # Aggregation-layer identity; without it the controller manager and scheduler log a
    # missing requestheader CA bundle on every authentication config sync.
    issue("front-proxy-client", _name("front-proxy-client"), ExtendedKeyUsageOID.CLIENT_AUTH, [])
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki / "sa.key", sa_key)
    (pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def write_kubeconfig(path: Path, server: str, pki: Path) -> None:
    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    # JSON is valid YAML: every kubeconfig reader accepts it, and no YAML library is needed.
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "pdmtp-local",
                "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")},
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": b64("admin.crt"),
                    "client-key-data": b64("admin.key"),
                },
            }
        ],
        "contexts": [
            {"name": "pdmtp-local", "context": {"cluster": "pdmtp-local", "user": "admin"}}
        ],
        "current-context": "pdmtp-local",
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)


def fake_gpu_node(
    name: str,
    rack: str | None = None,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A Node KWOK manages (it carries NODE_SELECTOR_ANNOTATION), with 8 GPUs; `rack` sets
    RACK_LABEL, `labels` and `taints` are added as given."""
    resources = {
        "cpu": "192",
        "memory": "2Ti",
        "ephemeral-storage": "10Ti",
        "pods": "110",
        GPU_RESOURCE: "8",
        RDMA_RESOURCE: "1000",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "fake-8xgpu",
                "nvidia.com/gpu.present": "true",
                "type": "kwok",
                **({RACK_LABEL: rack} if rack else {}),
                **(labels or {}),
            },
            "annotations": {
                NODE_SELECTOR_ANNOTATION[0]: NODE_SELECTOR_ANNOTATION[1],
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        **({"spec": {"taints": taints}} if taints else {}),
        # Nodes keep status on create (a kubelet registers the same way): KWOK then only adds
        # conditions, so capacity stays exactly as declared here.
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [
                {"type": "InternalIP", "address": LOOPBACK},
                {"type": "Hostname", "address": name},
            ],
        },
    }


IP_POOL_PRIMER = "pdmtp-kwok-ip-primer"


def ip_pool_primer(node: str) -> dict[str, Any]:
    """A pod bound to fake node `node` that only makes KWOK create its pod IP pool.

    The pinned KWOK creates the pool for a CIDR the first time it hands out an address, as a load
    then a separate store, and its stage workers run in parallel: the first pods of a fresh
    KWOK, Ready at the same moment, can each draw from a pool of their own and share an IP (seen
    in CI: a prefill and a decode pod both at 10.244.0.1, so the prefill pod looked listed by a
    router that listed the decode one, and its removal waited forever). No real cluster hands
    two live pods one address. One pod alone first makes the pool; every later pod shares it.
    """
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": IP_POOL_PRIMER,
            "namespace": "default",
            "annotations": {"pdmtp.io/fake-ready-delay-ms": "0"},
        },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [{"name": "primer", "image": "registry.invalid/pdmtp/primer:0"}],
        },
    }


AUDIT_POLICY = """\
# Which client wrote what, when: the leader-election tests read it (tests/cluster/
# test_leader_election.py) to prove a fenced operator's writes never landed. Metadata only, and
# only writes to what the operator manages (not the fake kubelets' status updates, not Leases).
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
    resources:
      - group: ""
        resources: [pods, services, serviceaccounts, events]
      - group: apps
        resources: [deployments, deployments/scale, controllerrevisions]
      - group: networking.k8s.io
        resources: [networkpolicies]
      - group: policy
        resources: [poddisruptionbudgets]
      - group: scheduling.k8s.io
        resources: [podgroups]
      - group: pdmtp.io
        resources: [pddeployments/status, pdrolescales, pdrolescales/status]
  - level: None
"""


@dataclass
class LocalCluster:
    """One control plane rooted at ``state_dir`` (pki/, logs/, etcd/, kubeconfig, state.json)."""

    state_dir: Path
    bin_dir: Path = field(default_factory=default_bin_dir)
    nodes: int = 4
    # For in-process use (pytest): a guard process stops the components once this process is
    # gone, so a crashed or killed test run leaves no strays. The CLI's `up` leaves it off to
    # detach.
    die_with_parent: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    gang_scheduling: bool = True
    """Serve the Workload API (`workload_api`); off: a cluster as most are today, where the
    operator must refuse multi-node specs (tests/cluster/test_multinode.py)."""

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).resolve()
        self.bin_dir = Path(self.bin_dir).resolve()
        self._ports: dict[str, int] = {}

    # ---- paths -------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def audit_log(self) -> Path:
        """Every write to the kinds pdmtp manages, one JSON line each (`AUDIT_POLICY`)."""
        return self.state_dir / "audit.log"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    def load_state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self.state_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return state

    def _save_state(self, **updates: Any) -> None:
        state = self.load_state() | updates
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.state_file)

    @property
    def server(self) -> str:
        port = self._ports.get("apiserver") or self.load_state().get("ports", {}).get("apiserver")
        if not port:
            raise ClusterError(f"no apiserver recorded in {self.state_file}")
        return f"https://{LOOPBACK}:{port}"

    # ---- HTTP to the apiserver (stdlib only) --------------------------------------------------
    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10) -> Any:
        """Call the apiserver as admin; returns decoded JSON (or text for non-JSON bodies)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        # An empty ProxyHandler: loopback traffic must never go through an HTTP proxy.
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}),
            urllib.request.HTTPSHandler(context=self._ssl_context()),
        )
        with opener.open(req, timeout=timeout) as resp:
            raw = resp.read().decode()
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 120) -> None:
        """Start every component, wait for readiness, register fake GPU nodes."""
        for attempt in range(3):
            try:
                self._start(timeout)
                return
            except ClusterError as exc:
                # Another process can grab a picked port before the component binds it; a
                # fresh set of ports fixes that.
                if "address already in use" not in str(exc) or attempt == 2:
                    raise

    def _start(self, timeout: float) -> None:
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ClusterError(
                f"missing binaries in {self.bin_dir}: {', '.join(missing)}; run `make cluster-bins`"
            )
        if self.running_pids():
            raise ClusterError(f"a cluster is already running from {self.state_dir}; run `down`")
        t0 = time.monotonic()
        deadline = t0 + timeout
        self._reset_state_dir()
        make_pki(self.pki)
        (self.state_dir / "audit-policy.yaml").write_text(AUDIT_POLICY)
        self._ports = dict(zip(PORTS, free_ports(len(PORTS)), strict=True))
        self._save_state(version=K8S_VERSION, bin_dir=str(self.bin_dir), ports=self._ports, pids={})
        write_kubeconfig(self.kubeconfig, self.server, self.pki)
        self.timings["pki"] = time.monotonic() - t0
        try:
            self._spawn("etcd", self._etcd_args())
            self._wait("etcd healthy", self._etcd_healthy, deadline)
            self._spawn("kube-apiserver", self._apiserver_args())
            self._wait("apiserver /readyz", self._apiserver_ready, deadline)
            self.timings["apiserver"] = time.monotonic() - t0
            self._spawn("kube-controller-manager", self._controller_manager_args())
            self._spawn("kube-scheduler", self._scheduler_args())
            self._spawn("kwok", self._kwok_args(), env={"HOME": str(self.state_dir / "kwok-home")})
            for name in ("controller-manager", "scheduler"):
                probe = functools.partial(_https_ok, self._ports[name], "/healthz")
                self._wait(f"{name} /healthz", probe, deadline)
            self._wait("default ServiceAccount", self._default_sa_exists, deadline)
            self._create_nodes()
            self._wait(f"{self.nodes} Ready untainted nodes", self._nodes_ready, deadline)
            if self.nodes:  # no fake node, no fake pod IPs to hand out
                self._prime_ip_pool(deadline)
            if self.die_with_parent:
                self._start_guard()
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        self._save_state(timings=self.timings)

    def stop(self, grace: float = 10) -> None:
        """Stop the components in reverse start order: SIGTERM each one and its children, SIGKILL
        what outlives ``grace``. Etcd goes last so the apiserver can shut down cleanly.

        Logs stay in the state dir for post-mortems.
        """
        for name in reversed(COMPONENTS):
            self._end(name, grace)
        if self.state_file.exists():
            self._save_state(pids={})

    def kill(self, *names: str) -> None:
        """SIGKILL components (and their children), as a crash or a node loss would."""
        for name in names:
            self._end(name, grace=None)
        pids = self.load_state().get("pids", {})
        self._save_state(pids={k: pid for k, pid in pids.items() if k not in names})

    def _end(self, name: str, grace: float | None) -> None:
        """SIGTERM component `name` and its children, SIGKILL what outlives `grace` (None: at
        once)."""
        proc = self._process(name)
        if proc is None:
            return
        alive = [proc, *_children(proc)]
        if grace is not None:
            for member in alive:
                with contextlib.suppress(psutil.Error):
                    member.terminate()
            _, alive = psutil.wait_procs(alive, timeout=grace)
        for member in alive:
            with contextlib.suppress(psutil.Error):
                member.kill()
        psutil.wait_procs(alive, timeout=10)

    def restart(self, *names: str, timeout: float = 60) -> None:
        """Start killed components again, on their ports and data, in the order given; waits for
        etcd's health and the API server's readiness."""
        self._ports = self._ports or dict(self.load_state()["ports"])
        args = {"etcd": self._etcd_args, "kube-apiserver": self._apiserver_args}
        ready = {"etcd": self._etcd_healthy, "kube-apiserver": self._apiserver_ready}
        deadline = time.monotonic() + timeout
        for name in names:
            if self._process(name) is not None:
                raise ClusterError(f"{name} is still running")
            self._spawn(name, args[name]())
            self._wait(f"{name} back", ready[name], deadline)

    def running_pids(self) -> dict[str, int]:
        return {name: p.pid for name in COMPONENTS if (p := self._process(name)) is not None}

    def is_ready(self) -> bool:
        try:
            return self._apiserver_ready()
        except (ClusterError, OSError):
            return False

    def rss_bytes(self) -> dict[str, int]:
        """Resident memory of each component with its children."""
        out: dict[str, int] = {}
        for name in COMPONENTS:
            proc = self._process(name)
            if proc is None:
                continue
            total = 0
            for member in [proc, *_children(proc)]:
                with contextlib.suppress(psutil.Error):
                    total += member.memory_info().rss
            out[name] = total
        return out

    def log_tails(self, lines: int = 30) -> str:
        """The last lines of every component log, for failure diagnostics."""
        chunks = []
        for name in COMPONENTS:
            path = self.log_dir / f"{name}.log"
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                chunks.append(f"==> {path} <==\n" + "\n".join(tail))
        return "\n\n".join(chunks)

    # ---- internals -------------------------------------------------------------------------------
    def _reset_state_dir(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for sub in ("pki", "etcd", "logs", "kwok-home"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        for name in ("kubeconfig", "state.json"):
            (self.state_dir / name).unlink(missing_ok=True)
        self.log_dir.mkdir()
        (self.state_dir / "kwok-home").mkdir()

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.log_dir / f"{name}.log").open("ab")
        child_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.state_dir),
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        } | (env or {})
        # A new session per component: no controlling terminal, so `up` can return and the
        # cluster outlives the shell.
        proc = subprocess.Popen(
            [str(self.bin_dir / name), *args],
            cwd=self.state_dir,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        # The start time makes the record unambiguous: a reused pid is never taken for ours.
        started = psutil.Process(proc.pid).create_time()
        pids = self.load_state().get("pids", {}) | {name: [proc.pid, started]}
        self._save_state(pids=pids)

    def _start_guard(self) -> None:
        guard = [sys.executable, str(Path(__file__).resolve()), "guard"]
        guard += ["--dir", str(self.state_dir), "--parent", str(os.getpid())]
        subprocess.Popen(
            guard,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(self.log_dir / "guard.log").open("ab"),
            start_new_session=True,
        )

    def _wait(self, what: str, probe: Callable[[], bool], deadline: float) -> None:
        while True:
            self._check_alive()
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError, ClusterError):
                if probe():
                    return
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out waiting for {what}\n{self.log_tails()}")
            time.sleep(0.1)

    def _check_alive(self) -> None:
        for name in self.load_state().get("pids", {}):
            if self._process(name) is None:
                raise ClusterError(f"{name} exited early\n{self.log_tails()}")

    def _process(self, name: str) -> psutil.Process | None:
        """The running component `name` started from this state dir, or None."""
        record = self.load_state().get("pids", {}).get(name)
        if not record:
            return None
        pid, started = record
        try:
            proc = psutil.Process(pid)
            if proc.create_time() != started or proc.status() == psutil.STATUS_ZOMBIE:
                return None
        except psutil.Error:
            return None
        return proc

    def _etcd_args(self) -> list[str]:
        client = f"http://{LOOPBACK}:{self._ports['etcd']}"
        peer = f"http://{LOOPBACK}:{self._ports['etcd-peer']}"
        return [
            "--name=pdmtp",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=pdmtp={peer}",
            # Throw-away data: durability buys nothing and fsync dominates start-up time.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]

    def _apiserver_args(self) -> list[str]:
        pki = self.pki
        server = self.server
        return [
            f"--etcd-servers=http://{LOOPBACK}:{self._ports['etcd']}",
            f"--bind-address={LOOPBACK}",
            f"--advertise-address={LOOPBACK}",
            f"--secure-port={self._ports['apiserver']}",
            f"--tls-cert-file={pki / 'serving.crt'}",
            f"--tls-private-key-file={pki / 'serving.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=RBAC",
            f"--requestheader-client-ca-file={pki / 'ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            # The apiserver's own address is loopback, which Endpoints may not hold: publish no
            # endpoints for the `kubernetes` Service rather than log a sync error forever.
            "--endpoint-reconciler-type=none",
            f"--service-account-issuer={server}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            # Logs/exec go to the node's InternalIP, which is 127.0.0.1 (KWOK's own server).
            "--kubelet-preferred-address-types=InternalIP",
            *self._workload_api_args(runtime_config=True),
            f"--audit-policy-file={self.state_dir / 'audit-policy.yaml'}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-maxbackup=1",
            "--profiling=false",
            "--v=1",
        ]

    def _workload_api_args(self, runtime_config: bool = False) -> list[str]:
        api = workload_api()
        if api is None or not self.gang_scheduling:
            return []
        return [api.feature_gates_flag, *([api.runtime_config_flag] if runtime_config else [])]

    def _component_client_args(self, port: int) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--tls-cert-file={self.pki / 'serving.crt'}",
            f"--tls-private-key-file={self.pki / 'serving.key'}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ]

    def _controller_manager_args(self) -> list[str]:
        return [
            *self._component_client_args(self._ports["controller-manager"]),
            "--controllers=*",
            f"--service-account-private-key-file={self.pki / 'sa.key'}",
            f"--root-ca-file={self.pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={self.pki / 'ca.crt'}",
            f"--cluster-signing-key-file={self.pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # A control-plane outage the tests cause (tests/cluster/test_recovery.py) must not
            # become a node failure too: KWOK's leases go unrenewed while the API server is down,
            # and the node lifecycle controller would then mark every pod unready.
            "--node-monitor-grace-period=3m",
            # HPAs (tests/cluster/test_keda.py) act within a second of a metric change instead of
            # at the next 15 s sync; a new HPA waits one period before its first look, too.
            "--horizontal-pod-autoscaler-sync-period=1s",
            *self._workload_api_args(),
        ]

    def _scheduler_args(self) -> list[str]:
        return [*self._component_client_args(self._ports["scheduler"]), *self._workload_api_args()]

    def _kwok_args(self) -> list[str]:
        port = self._ports["kwok"]
        key, value = NODE_SELECTOR_ANNOTATION
        stages = sorted(KWOK_STAGE_DIR.glob("*.yaml"))
        if not stages:
            raise ClusterError(f"no KWOK stages in {KWOK_STAGE_DIR}")
        return [
            f"--kubeconfig={self.kubeconfig}",
            *(f"--config={path}" for path in stages),
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            f"--node-ip={LOOPBACK}",
            f"--node-port={port}",
            f"--server-address={LOOPBACK}:{port}",
            f"--tls-cert-file={self.pki / 'serving.crt'}",
            f"--tls-private-key-file={self.pki / 'serving.key'}",
            f"--cidr={POD_CIDR}",
            # KWOK renews node Leases itself, so nodes stay Ready without status churn.
            "--node-lease-duration-seconds=40",
        ]

    def _etcd_healthy(self) -> bool:
        url = f"http://{LOOPBACK}:{self._ports['etcd']}/health"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=2) as resp:
            return bool(json.loads(resp.read()).get("health") == "true")

    def _apiserver_ready(self) -> bool:
        if self.api("GET", "/readyz", timeout=5) != "ok":
            return False
        return bool(self.api("GET", "/api/v1/namespaces/default", timeout=5).get("metadata"))

    def _default_sa_exists(self) -> bool:
        sa = self.api("GET", "/api/v1/namespaces/default/serviceaccounts/default", timeout=5)
        return bool(sa.get("metadata"))

    def node_names(self) -> list[str]:
        return [f"pdmtp-gpu-{i}" for i in range(self.nodes)]

    def _create_nodes(self) -> None:
        for index, name in enumerate(self.node_names()):
            self.api("POST", "/api/v1/nodes", fake_gpu_node(name, rack_of(index, self.nodes)))

    def _prime_ip_pool(self, deadline: float) -> None:
        """One pod, alone, takes the first fake IP, then leaves (`ip_pool_primer`)."""
        path = f"/api/v1/namespaces/default/pods/{IP_POOL_PRIMER}"
        self.api("POST", "/api/v1/namespaces/default/pods", ip_pool_primer(self.node_names()[0]))
        self._wait(
            "KWOK's first pod IP",
            lambda: bool(self._pod(path).get("status", {}).get("podIP")),
            deadline,
        )
        self.api("DELETE", path)
        self._wait("KWOK's IP primer pod gone", lambda: not self._pod(path), deadline)

    def _pod(self, path: str) -> dict[str, Any]:
        try:
            found: dict[str, Any] = self.api("GET", path, timeout=5)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return {}
            raise
        return found

    def _nodes_ready(self) -> bool:
        nodes = self.api("GET", "/api/v1/nodes", timeout=5)["items"]
        ready = 0
        for node in nodes:
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            # The controller manager taints new nodes not-ready until it sees them Ready; the
            # scheduler would otherwise refuse pods for a moment after `up` returns.
            taints = node.get("spec", {}).get("taints") or []
            if conds.get("Ready") == "True" and not taints:
                ready += 1
        return ready >= self.nodes


# ---- helpers ---------------------------------------------------------------------------------
def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def _https_ok(port: int, path: str) -> bool:
    # Health endpoints of the controller manager and scheduler; their serving cert is our
    # throw-away one, but verification buys nothing on loopback here.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    with opener.open(f"https://{LOOPBACK}:{port}{path}", timeout=2) as resp:
        return bool(resp.status == 200)


# ---- CLI -------------------------------------------------------------------------------------
def _cmd_up(args: argparse.Namespace) -> int:
    # Attached: the components die with this process. Detached: they outlive it (and the shell).
    cluster = LocalCluster(Path(args.dir), nodes=args.nodes, die_with_parent=args.foreground)
    try:
        cluster.start(timeout=args.timeout)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"local cluster {K8S_VERSION} up in {cluster.timings['total']:.1f}s at {cluster.server}")
    print(f"logs: {cluster.log_dir}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    if not args.foreground:
        return 0
    print("running in the foreground; Ctrl-C stops it", flush=True)
    stop = False

    def on_signal(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    while not stop and cluster.running_pids().keys() == set(COMPONENTS):
        time.sleep(0.5)
    cluster.stop()
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    cluster = LocalCluster(Path(args.dir))
    if cluster.state_file.exists():
        cluster.bin_dir = Path(cluster.load_state().get("bin_dir", cluster.bin_dir))
    cluster.stop()
    if args.purge:
        shutil.rmtree(cluster.state_dir, ignore_errors=True)
    print(f"local cluster in {cluster.state_dir} stopped")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    cluster = LocalCluster(Path(args.dir))
    state = cluster.load_state()
    if not state:
        print(f"no cluster state in {cluster.state_dir}")
        return 1
    cluster.bin_dir = Path(state.get("bin_dir", cluster.bin_dir))
    running = cluster.running_pids()
    rss = cluster.rss_bytes()
    for name in COMPONENTS:
        pid = running.get(name)
        mark = "running" if name in running else "stopped"
        print(f"{name:24} {mark:8} pid={pid} rss={rss.get(name, 0) / 2**20:.0f}MiB")
    ready = cluster.is_ready()
    print(f"apiserver {cluster.server} ready={ready}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0 if ready and len(running) == len(COMPONENTS) else 1


def _cmd_guard(args: argparse.Namespace) -> int:
    """Wait for the parent to go, then stop its cluster (started by LocalCluster, not by hand)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(args.parent).wait()
    cluster = LocalCluster(Path(args.dir))
    if cluster.running_pids():
        cluster.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    guard = sub.add_parser("guard", help=argparse.SUPPRESS)
    guard.add_argument("--dir", required=True)
    guard.add_argument("--parent", type=int, required=True)
    for name in ("up", "down", "status"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--dir", default=".cluster", help="state dir (default .cluster)")
        if name == "up":
            cmd.add_argument("--nodes", type=int, default=4, help="fake GPU nodes (default 4)")
            cmd.add_argument("--timeout", type=float, default=120, help="seconds to wait")
            cmd.add_argument(
                "--foreground", action="store_true", help="stay attached; Ctrl-C tears down"
            )
        if name == "down":
            cmd.add_argument("--purge", action="store_true", help="also delete the state dir")
    args = parser.parse_args(argv)
    handlers = {"up": _cmd_up, "down": _cmd_down, "status": _cmd_status, "guard": _cmd_guard}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
