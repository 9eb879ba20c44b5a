"""KEDA's operator and metrics adapter as host processes on 127.0.0.1, so a test can have the
cluster's real HorizontalPodAutoscaler (kube-controller-manager) scale any object with a scale
subresource from an external metric.

    with running_keda(cluster.kubeconfig, tmp_path) as keda, MetricServer(10) as metric:
        target = ScaleTargetRef("pdmtp.io/v1alpha1", "PDRoleScale", "demo-decode")
        keda.create_scaled_object(ns, "demo-decode", target, [metrics_api_trigger(metric.url, 10)])
        keda.wait_scaling_active(ns, "demo-decode")
        metric.value = 30   # the HPA sets the target's spec.replicas to 3 within a sync period

Start installs KEDA's CRDs (the copy hack/keda/build.sh took from the module), makes a throw-away
CA and one certificate (operator<->adapter gRPC, mutual TLS; the adapter's aggregated API), the
keda namespace, a Service of type ExternalName naming 127.0.0.1 and the APIService
v1beta1.external.metrics.k8s.io with that CA, starts both binaries with every listener on
127.0.0.1 and logs in the work dir, and returns once the aggregator reports the APIService
Available. The aggregator dials https://127.0.0.1:<port> and verifies the name
<service>.<namespace>.svc, which the certificate carries. The adapter learns the front proxy's CA
from kube-system/extension-apiserver-authentication, so only the kubeconfig is needed.

Stop undoes all of it, in an order that leaves the cluster as it was for the tests that share it:
KEDA objects first (their finalizers need the operator), then the APIService (an APIService with
no server behind it fails discovery for every client), then the processes, then the rest.

Only for control planes whose aggregator runs on this host (hack/lib/localcluster.py): the
APIService points at this host's loopback. Not for kind, whose API server runs in a container.
One harness per cluster: start refuses an external.metrics.k8s.io APIService it did not create.

kube-controller-manager learns of new kinds only when it resets its discovery cache, every 30 s:
until then an HPA whose target is of a CRD installed just before answers FailedGetScale ("no
matches for kind"). `wait_scaling_active` waits that out; installing the target's CRD before
starting KEDA overlaps the two waits.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import datetime
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

import psutil  # type: ignore[import-untyped]
import yaml
from cluster.kubehelpers import install_crd, kubeconfig_server, wait_for
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from localcluster import cache_dir
from loopback import LOOPBACK, free_ports, is_loopback_url
from versions import read_versions

KEDA_VERSION: Final = read_versions()["KEDA_VERSION"]
BUILD_DIR: Final = Path(__file__).resolve().parents[2] / "hack" / "keda"
BUILD_INPUTS: Final = ("build.sh", "adapter-metrics-loopback.patch")
BINARIES: Final = ("keda-operator", "keda-adapter")
KEDA_GROUP: Final = ("keda.sh", "v1alpha1")
APISERVICE: Final = "v1beta1.external.metrics.k8s.io"
METRICS_PATH: Final = "/apis/external.metrics.k8s.io/v1beta1"
SERVICE: Final = "keda-metrics-apiserver"
# The gRPC server name the adapter verifies (its --metrics-service-grpc-authority).
OPERATOR_NAME: Final = "keda-operator"
# On every cluster object this harness creates; an APIService without it is someone else's.
MANAGED_BY: Final = ("app.kubernetes.io/managed-by", "pdmtp-test-keda")
PORTS: Final = (
    "operator-metrics",
    "operator-health",
    "operator-grpc",
    "adapter",
    "adapter-metrics",
)


class KedaError(RuntimeError):
    """KEDA could not be started against the cluster, or stopped cleanly."""


@dataclass(frozen=True)
class _Resource:
    group: str
    version: str
    plural: str
    namespaced: bool

    @property
    def gvp(self) -> tuple[str, str, str]:
        return self.group, self.version, self.plural


def keda_dir(version: str = KEDA_VERSION) -> Path:
    """Where hack/keda/build.sh puts the binaries and CRDs of `version`."""
    return cache_dir() / "keda" / f"v{version}"


def build_key(version: str = KEDA_VERSION) -> str:
    """The stamp hack/keda/build.sh writes: a hash of the version, the script and the patch."""
    data = f"v{version}\n".encode() + b"".join((BUILD_DIR / n).read_bytes() for n in BUILD_INPUTS)
    return hashlib.sha256(data).hexdigest()[:12]


def build_problem(where: Path | None = None) -> str | None:
    """Why the KEDA build in `where` cannot be used (missing or stale), or None when it can."""
    where = where or keda_dir()
    missing = [n for n in BINARIES if not os.access(where / n, os.X_OK)]
    if missing or not (where / "crds").is_dir():
        what = ", ".join(missing) or "crds/"
        return f"KEDA {KEDA_VERSION} is not built ({what} missing in {where}); run `make keda-bins`"
    stamp = (where / ".stamp").read_text().strip() if (where / ".stamp").exists() else ""
    if stamp != build_key():
        return (
            f"the KEDA build in {where} is stale (stamp {stamp or 'none'}, inputs {build_key()}); "
            "run `make keda-bins`"
        )
    return None


# ---- what tests create ------------------------------------------------------------------------
@dataclass(frozen=True)
class ScaleTargetRef:
    """Any object with a scale subresource: ("pdmtp.io/v1alpha1", "PDRoleScale", "x-decode")."""

    api_version: str
    kind: str
    name: str

    def as_dict(self) -> dict[str, str]:
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}


def metrics_api_trigger(
    url: str, target: float, value_location: str = "value", metric_type: str = "AverageValue"
) -> dict[str, Any]:
    """A `metrics-api` trigger: KEDA's operator GETs `url` (JSON) and reads `value_location`.
    AverageValue: the HPA wants ceil(value / target) replicas."""
    if not is_loopback_url(url):
        raise ValueError(f"{url}: the metric server must be on loopback")
    return {
        "type": "metrics-api",
        "metricType": metric_type,
        "metadata": {"url": url, "valueLocation": value_location, "targetValue": f"{target:g}"},
    }


def scaled_object_body(
    namespace: str,
    name: str,
    target: ScaleTargetRef,
    triggers: Sequence[Mapping[str, Any]],
    *,
    min_replicas: int = 1,
    max_replicas: int = 10,
    polling_interval: int = 5,
    scale_up_window: int = 0,
    scale_down_window: int = 0,
) -> dict[str, Any]:
    """A ScaledObject. The stabilization windows default to 0 (the HPA's scale-down default is
    300 s); min_replicas >= 1 keeps KEDA's own 0<->1 activation out, so the HPA does every step."""
    behavior = {
        "scaleUp": {"stabilizationWindowSeconds": scale_up_window},
        "scaleDown": {"stabilizationWindowSeconds": scale_down_window},
    }
    return {
        "apiVersion": "/".join(KEDA_GROUP),
        "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "scaleTargetRef": target.as_dict(),
            "pollingInterval": polling_interval,
            "minReplicaCount": min_replicas,
            "maxReplicaCount": max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior}},
            "triggers": [dict(t) for t in triggers],
        },
    }


class MetricServer:
    """GET http://127.0.0.1:<port>/ -> {"value": <value>}; set `value` to move the metric."""

    def __init__(self, value: float = 0) -> None:
        self.value = value
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests += 1
                body = json.dumps({"value": server.value}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.url = f"http://{LOOPBACK}:{self._http.server_address[1]}/"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def __enter__(self) -> MetricServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._http.shutdown()
        self._http.server_close()


# ---- the harness ------------------------------------------------------------------------------
_STARTED: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftovers() -> None:
    """Processes a harness started and did not stop (an interrupted run)."""
    for proc in _STARTED:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


_PRCTL: Final = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the child
_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent() -> None:
    # Runs in the child before exec: the kernel sends SIGKILL once the thread that started it is
    # gone, however it ended (atexit does not run on SIGKILL).
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Keda:
    """KEDA's operator and metrics adapter against the cluster of `kubeconfig`; files in
    `work_dir` (certs/, keda-operator.log, keda-adapter.log). Use `running_keda`, or call
    start() and stop()."""

    def __init__(
        self,
        kubeconfig: Path,
        work_dir: Path,
        bin_dir: Path | None = None,
        namespace: str = "keda",
    ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.work_dir = Path(work_dir).resolve()
        self.bin_dir = bin_dir or keda_dir()
        self.namespace = namespace
        self.ports: dict[str, int] = {}
        self.timings: dict[str, float] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._crds: list[dict[str, Any]] = []
        self._api = client.ApiClient()  # replaced by start()

    @property
    def cert_dir(self) -> Path:
        return self.work_dir / "certs"

    def log_path(self, name: str) -> Path:
        return self.work_dir / f"{name}.log"

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 120) -> None:
        """Install, start, and wait until the aggregator serves external.metrics.k8s.io."""
        problem = build_problem(self.bin_dir)
        if problem:
            raise KedaError(problem)
        server = kubeconfig_server(self.kubeconfig)
        if not is_loopback_url(server):
            raise KedaError(f"{self.kubeconfig}: server {server!r} is not loopback")
        for attempt in range(3):
            try:
                self._start(timeout)
                return
            except KedaError as exc:
                # Another process can take a picked port before KEDA binds it; new ports fix it.
                if "address already in use" not in str(exc) or attempt == 2:
                    raise

    def _start(self, timeout: float) -> None:
        self._api = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig)
        )
        t0 = time.monotonic()
        deadline = t0 + timeout
        self._claim_apiservice()
        try:
            self._install_crds(timeout)
            self.timings["crds"] = time.monotonic() - t0
            self.work_dir.mkdir(parents=True, exist_ok=True)
            make_certs(self.cert_dir, self._names())
            (self.work_dir / "ca").mkdir(exist_ok=True)
            shutil.copy(self.cert_dir / "ca.crt", self.work_dir / "ca" / "ca.crt")
            self._ensure_namespace(timeout)
            self._apply_service()
            self.ports = dict(zip(PORTS, free_ports(len(PORTS)), strict=True))
            self._spawn("keda-operator", self._operator_args())
            self._spawn("keda-adapter", self._adapter_args())
            self._create_apiservice()
            self._wait("the APIService Available", self._apiservice_available, deadline)
            self._wait(f"GET {METRICS_PATH}", self._metrics_api_served, deadline)
            self.check_loopback_listeners()
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0

    def stop(self, grace: float = 10) -> None:
        """Tear down in reverse; keeps going past a failed step and raises the first error."""
        t0 = time.monotonic()
        errors: list[BaseException] = []
        steps = (
            self._delete_keda_objects,
            self._delete_apiservice,
            lambda: self._end_processes(grace),
            self._delete_namespace,
            self._delete_crds,
        )
        for step in steps:
            try:
                step()
            except Exception as exc:
                errors.append(exc)
        self._api.close()  # type: ignore[no-untyped-call]
        self.timings["stop"] = time.monotonic() - t0
        if errors:
            raise KedaError(f"KEDA teardown: {errors[0]}") from errors[0]

    def __enter__(self) -> Keda:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    # ---- for tests ---------------------------------------------------------------------------
    def create_scaled_object(
        self,
        namespace: str,
        name: str,
        target: ScaleTargetRef,
        triggers: Sequence[Mapping[str, Any]],
        **options: int,
    ) -> dict[str, Any]:
        """Create a ScaledObject (options: those of `scaled_object_body`)."""
        body = scaled_object_body(namespace, name, target, triggers, **options)
        created: dict[str, Any] = self._custom.create_namespaced_custom_object(
            *KEDA_GROUP, namespace, "scaledobjects", body
        )
        return created

    def delete_scaled_object(self, namespace: str, name: str, timeout: float = 30) -> None:
        """Delete a ScaledObject and wait until KEDA has released it (its HPA goes with it)."""
        custom = self._custom
        try:
            custom.delete_namespaced_custom_object(*KEDA_GROUP, namespace, "scaledobjects", name)
        except ApiException as exc:
            if exc.status != 404:
                raise

        def gone() -> bool:
            try:
                custom.get_namespaced_custom_object(*KEDA_GROUP, namespace, "scaledobjects", name)
            except ApiException as exc:
                if exc.status == 404:
                    return True
                raise
            return False

        wait_for(gone, f"ScaledObject {namespace}/{name} deleted", timeout, 0.25, transient=())

    def wait_scaling_active(self, namespace: str, name: str, timeout: float = 90) -> str:
        """Wait until the ScaledObject is Ready and its HPA has read the metric once
        (ScalingActive); returns the HPA's name."""

        def active() -> str | None:
            so = self._custom.get_namespaced_custom_object(
                *KEDA_GROUP, namespace, "scaledobjects", name
            )
            status = so.get("status") or {}
            ready = _condition(status.get("conditions"), "Ready")
            hpa_name = status.get("hpaName")
            if ready != "True" or not hpa_name:
                return None
            hpa = client.AutoscalingV2Api(self._api).read_namespaced_horizontal_pod_autoscaler(
                hpa_name, namespace
            )
            listed = hpa.status.conditions if hpa.status else None
            conditions = [{"type": c.type, "status": c.status} for c in listed or []]
            return str(hpa_name) if _condition(conditions, "ScalingActive") == "True" else None

        return wait_for(active, f"ScaledObject {namespace}/{name} scaling", timeout, 0.25)

    def log_tails(self, lines: int = 40) -> str:
        chunks = []
        for name in BINARIES:
            path = self.log_path(name)
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                chunks.append(f"==> {path} <==\n" + "\n".join(tail))
        return "\n\n".join(chunks)

    def describe(self, namespace: str) -> str:
        """The namespace's ScaledObjects and HPAs as YAML, and the KEDA logs: for a failed test."""
        docs: list[Any] = []
        with contextlib.suppress(ApiException):
            listed = self._custom.list_namespaced_custom_object(
                *KEDA_GROUP, namespace, "scaledobjects"
            )
            docs += listed.get("items", [])
        with contextlib.suppress(ApiException):
            hpas = client.AutoscalingV2Api(self._api).list_namespaced_horizontal_pod_autoscaler(
                namespace
            )
            docs += [self._api.sanitize_for_serialization(h) for h in hpas.items]  # type: ignore[no-untyped-call]
        return yaml.safe_dump_all(docs, sort_keys=False) + "\n" + self.log_tails()

    def check_loopback_listeners(self) -> None:
        """Raise if either process listens anywhere but loopback (the network rule)."""
        for name, proc in self._procs.items():
            with contextlib.suppress(psutil.Error):
                for conn in psutil.Process(proc.pid).net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN and not _is_loopback(conn.laddr.ip):
                        raise KedaError(f"{name} listens on {conn.laddr.ip}:{conn.laddr.port}")

    # ---- start ---------------------------------------------------------------------------------
    @property
    def _custom(self) -> Any:
        return client.CustomObjectsApi(self._api)

    @property
    def _registration(self) -> Any:
        return client.ApiregistrationV1Api(self._api)

    def _names(self) -> list[str]:
        return [
            "localhost",
            OPERATOR_NAME,
            f"{OPERATOR_NAME}.{self.namespace}.svc",
            f"{SERVICE}.{self.namespace}.svc",
        ]

    def _labels(self) -> dict[str, str]:
        return {MANAGED_BY[0]: MANAGED_BY[1]}

    def _claim_apiservice(self) -> None:
        """Refuse someone else's APIService; remove one a crashed harness left behind."""
        try:
            existing = self._registration.read_api_service(APISERVICE)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        if (existing.metadata.labels or {}).get(MANAGED_BY[0]) != MANAGED_BY[1]:
            raise KedaError(f"APIService {APISERVICE} exists and is not this harness's")
        self._delete_apiservice()

    def _install_crds(self, timeout: float) -> None:
        # Together: the API server takes a while over each (big schemas) and waits are shared.
        paths = sorted((self.bin_dir / "crds").glob("*.yaml"))
        with ThreadPoolExecutor(len(paths)) as pool:
            self._crds += pool.map(lambda path: install_crd(self._api, path, timeout), paths)

    def _ensure_namespace(self, timeout: float) -> None:
        core = client.CoreV1Api(self._api)
        body = client.V1Namespace(
            metadata=client.V1ObjectMeta(name=self.namespace, labels=self._labels())
        )

        def created() -> bool:
            try:
                core.create_namespace(body)
                return True
            except ApiException as exc:
                if exc.status != 409:
                    raise
            # There already; wait out a deletion that a previous stop began.
            status = core.read_namespace(self.namespace).status
            return status is not None and status.phase != "Terminating"

        wait_for(created, f"namespace {self.namespace}", timeout, 0.5, transient=())

    def _apply_service(self) -> None:
        # ExternalName: the aggregator resolves the Service to https://<externalName>:<port>; an
        # Endpoints or EndpointSlice object may not hold a loopback address.
        body = client.V1Service(
            metadata=client.V1ObjectMeta(name=SERVICE, labels=self._labels()),
            spec=client.V1ServiceSpec(type="ExternalName", external_name=LOOPBACK),
        )
        core = client.CoreV1Api(self._api)
        with contextlib.suppress(ApiException):
            core.delete_namespaced_service(SERVICE, self.namespace)
        core.create_namespaced_service(self.namespace, body)

    def _create_apiservice(self) -> None:
        ca = base64.b64encode((self.cert_dir / "ca.crt").read_bytes()).decode()
        group, version = METRICS_PATH.removeprefix("/apis/").split("/")
        body = {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": APISERVICE, "labels": self._labels()},
            "spec": {
                "group": group,
                "version": version,
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
                "caBundle": ca,
                "service": {
                    "name": SERVICE,
                    "namespace": self.namespace,
                    "port": self.ports["adapter"],
                },
            },
        }
        self._registration.create_api_service(body)

    def _env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.work_dir),
            "KUBECONFIG": str(self.kubeconfig),
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            # Where KEDA keeps cluster-scoped secrets; watch every namespace.
            "POD_NAMESPACE": self.namespace,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": self.namespace,
            "WATCH_NAMESPACE": "",
        }

    def _operator_args(self) -> list[str]:
        p, certs = self.ports, self.cert_dir
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--metrics-bind-address={LOOPBACK}:{p['operator-metrics']}",
            f"--health-probe-bind-address={LOOPBACK}:{p['operator-health']}",
            f"--metrics-service-bind-address={LOOPBACK}:{p['operator-grpc']}",
            # The gRPC server's certificate and the CA its client (the adapter) must present.
            f"--cert-dir={certs}",
            # Extra CAs for the scalers' HTTPS clients: ours, for metric servers that use it.
            # Every file there must be a certificate, hence its own directory.
            f"--ca-dir={self.work_dir / 'ca'}",
            "--enable-cert-rotation=false",
            "--leader-elect=false",
            "--zap-log-level=info",
        ]

    def _adapter_args(self) -> list[str]:
        p, certs, kc = self.ports, self.cert_dir, self.kubeconfig
        return [
            f"--kubeconfig={kc}",
            f"--lister-kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={p['adapter']}",
            # --cert-dir also holds the gRPC client's certificate (tls.crt) and CA (ca.crt).
            f"--cert-dir={certs}",
            f"--tls-cert-file={certs / 'tls.crt'}",
            f"--tls-private-key-file={certs / 'tls.key'}",
            f"--metrics-service-address={LOOPBACK}:{p['operator-grpc']}",
            f"--metrics-service-grpc-authority={OPERATOR_NAME}",
            # Bound to 127.0.0.1 by hack/keda/adapter-metrics-loopback.patch.
            f"--port={p['adapter-metrics']}",
            "--zap-log-level=info",
        ]

    def _spawn(self, name: str, args: list[str]) -> None:
        with self.log_path(name).open("ab") as log:
            proc = subprocess.Popen(
                [str(self.bin_dir / name), *args],
                cwd=self.work_dir,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self._procs[name] = proc
        _STARTED.add(proc)

    def _wait(self, what: str, probe: Callable[[], bool], deadline: float) -> None:
        while True:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise KedaError(f"{name} exited ({proc.returncode})\n{self.log_tails()}")
            with contextlib.suppress(ApiException, OSError, urllib.error.URLError):
                if probe():
                    return
            if time.monotonic() > deadline:
                raise KedaError(f"timed out waiting for {what}\n{self.log_tails()}")
            time.sleep(0.2)

    def _apiservice_available(self) -> bool:
        status = self._registration.read_api_service(APISERVICE).status
        conditions = [{"type": c.type, "status": c.status} for c in status.conditions or []]
        return _condition(conditions, "Available") == "True"

    def _metrics_api_served(self) -> bool:
        # Through the aggregator's proxy, as the HPA controller will call it.
        method, url, headers, _, _ = self._api.param_serialize(
            "GET", METRICS_PATH, auth_settings=["BearerToken"]
        )
        return bool(self._api.call_api(method, url, headers, _request_timeout=5).status == 200)

    # ---- stop ------------------------------------------------------------------------------------
    def _keda_objects(self) -> list[tuple[_Resource, str | None, str]]:
        """(resource, namespace, name) of every object of the KEDA CRDs this harness installed."""
        out: list[tuple[_Resource, str | None, str]] = []
        for crd in self._crds:
            spec = crd["spec"]
            resource = _Resource(
                spec["group"],
                next(v["name"] for v in spec["versions"] if v.get("storage")),
                spec["names"]["plural"],
                spec["scope"] == "Namespaced",
            )
            try:
                listed = self._custom.list_cluster_custom_object(*resource.gvp)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            for item in listed["items"]:
                meta = item["metadata"]
                out.append((resource, meta.get("namespace"), meta["name"]))
        return out

    def _delete_keda_objects(self, timeout: float = 30) -> None:
        """Delete every ScaledObject, ScaledJob, TriggerAuthentication, ... while the operator
        still runs to release their finalizers; strip the finalizers of what is left after
        `timeout` (a namespace holding such an object would never finish deleting)."""
        custom = self._custom
        for resource, ns, name in self._keda_objects():
            with contextlib.suppress(ApiException):
                if ns:
                    group, version, plural = resource.gvp
                    custom.delete_namespaced_custom_object(group, version, ns, plural, name)
                else:
                    custom.delete_cluster_custom_object(*resource.gvp, name)
        deadline = time.monotonic() + timeout
        while self._keda_objects() and time.monotonic() < deadline:
            time.sleep(0.25)
        release = {"metadata": {"finalizers": None}}
        for resource, ns, name in self._keda_objects():
            with contextlib.suppress(ApiException):
                if ns:
                    group, version, plural = resource.gvp
                    custom.patch_namespaced_custom_object(group, version, ns, plural, name, release)
                else:
                    custom.patch_cluster_custom_object(*resource.gvp, name, release)

    def _delete_apiservice(self) -> None:
        registration = self._registration
        try:
            registration.delete_api_service(APISERVICE)
        except ApiException as exc:
            if exc.status != 404:
                raise

        def gone() -> bool:
            try:
                registration.read_api_service(APISERVICE)
            except ApiException as exc:
                if exc.status == 404:
                    return True
                raise
            return False

        wait_for(gone, f"APIService {APISERVICE} deleted", 30, transient=())

    def _end_processes(self, grace: float) -> None:
        for name in reversed(list(self._procs)):
            proc = self._procs.pop(name)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
            _STARTED.discard(proc)

    def _delete_namespace(self) -> None:
        # With the Service in it. Not waited for: a next start waits if it needs the name.
        try:
            client.CoreV1Api(self._api).delete_namespace(self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _delete_crds(self, timeout: float = 30) -> None:
        ext = client.ApiextensionsV1Api(self._api)
        names = [crd["metadata"]["name"] for crd in self._crds]
        for name in names:
            with contextlib.suppress(ApiException):
                ext.delete_custom_resource_definition(name)

        def gone() -> bool:
            for name in names:
                try:
                    ext.read_custom_resource_definition(name)
                    return False
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            return True

        wait_for(gone, "KEDA CRDs deleted", timeout, 0.25, transient=())
        self._crds.clear()


@contextlib.contextmanager
def running_keda(
    kubeconfig: Path, work_dir: Path, bin_dir: Path | None = None, timeout: float = 120
) -> Iterator[Keda]:
    """KEDA running against the cluster of `kubeconfig` for the `with` block; torn down after."""
    keda = Keda(kubeconfig, work_dir, bin_dir)
    keda.start(timeout)
    try:
        yield keda
    finally:
        keda.stop()


# ---- helpers ----------------------------------------------------------------------------------
def make_certs(where: Path, names: Sequence[str]) -> None:
    """ca.crt, and tls.crt/tls.key for 127.0.0.1 and `names`, good for serving and as a client:
    the file names KEDA's --cert-dir expects."""
    where.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pdmtp-test-keda-ca")])
    ca = (
        _cert_builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(LOOPBACK))]
    sans += [x509.DNSName(n) for n in names]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, OPERATOR_NAME)])
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    leaf = (
        _cert_builder(subject, ca_name, key.public_key(), now)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (where / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (where / "tls.crt").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (where / "tls.key").write_bytes(pem)
    (where / "tls.key").chmod(0o600)


def _cert_builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, now: Any
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
    )


def _condition(conditions: Sequence[Mapping[str, Any]] | None, kind: str) -> str | None:
    return next((str(c.get("status")) for c in conditions or [] if c.get("type") == kind), None)


def _is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False
