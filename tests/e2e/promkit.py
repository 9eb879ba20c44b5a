"""Prometheus on the host against the kind cluster, for tests/e2e/test_alerts.py: the chart's
alert rules (charts/pdmtp/files/alerts.yaml) evaluated over what the operator and the emulated
engines really export.

How it reaches the pods (network rule: loopback only): every target is scraped through the kind
API server on 127.0.0.1, the TLS client credentials of the kind kubeconfig written to files.
Service discovery (kubernetes_sd_configs, the same kubeconfig) finds the pods; relabelling points
`__address__` at the API server and `__metrics_path__` at the pod proxy:

- the operator's pods directly, `/api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/metrics`;
- the PDDeployments' engine and router pods through a relay pod (scrape_relay.py) in the test's
  namespace, because the engines' NetworkPolicy refuses the API server's dial from the
  control-plane node and admits the relay (labelled as a metrics scraper).

Target labels are those the Prometheus Operator gives a ServiceMonitor's or PodMonitor's targets
(namespace, service, pod, container, endpoint, job, instance = the pod's address), followed by
the monitor's own honorLabels, relabelings and metricRelabelings read from the rendered chart, so
the rules see the labels a chart install would give them. Where the chart renders no PodMonitor
for the engines, ENGINE_MONITOR stands in (what a user would write: the pods' `metrics` port).

The rules file is loaded with every `for` shortened (the real durations are held by
`promtool test rules` in tests/unit/test_alerts.py), scraped and evaluated every
INTERVAL_SECONDS.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import yaml
from chart import CHART, NAMESPACE, render
from e2e.kindkit import Kind, wait_for
from loopback import free_ports

Obj = dict[str, Any]

INTERVAL_SECONDS: Final = 2
"""Scrape and rule evaluation interval: an alert fires within a few of these of its condition."""
SHORT_FOR: Final = "6s"
"""Every rule's `for` in the test: three evaluations, so a one-scrape blip still does not fire."""
MONITOR_API: Final = "monitoring.coreos.com/v1"
ENGINE_MONITOR: Final[Obj] = {
    "kind": "PodMonitor",
    "metadata": {"name": "pdmtp-workloads"},
    "spec": {
        "selector": {
            "matchExpressions": [{"key": "pdmtp.io/role", "operator": "Exists"}],
        },
        "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics"}],
    },
}
"""The PodMonitor a user would write for the PDDeployments' pods (used when the chart has none)."""
RELAY_NAME: Final = "pdmtp-scrape-relay"
RELAY_PORT: Final = 8080
RELAY_SOURCE: Final = Path(__file__).with_name("scrape_relay.py")
WORKLOAD_METRICS_PORTS: Final = (29100, 29000)
"""What the relay may dial: the engines' metrics-only port and the routers' metrics port
(pdmtp.api.vocabulary ENGINE_METRICS_PORT, ROUTER_METRICS_PORT)."""


# ---- pure: credentials, monitors, scrape configs, rules ----------------------------------------


@dataclass(frozen=True)
class ApiAccess:
    """The API server's host:port and the client TLS files Prometheus scrapes it with."""

    host_port: str
    kubeconfig: Path
    ca_file: Path
    cert_file: Path
    key_file: Path

    def tls_config(self) -> Obj:
        return {
            "ca_file": str(self.ca_file),
            "cert_file": str(self.cert_file),
            "key_file": str(self.key_file),
        }


def api_access(kubeconfig: Path, directory: Path) -> ApiAccess:
    """The current context's server and credentials, the embedded ones written to `directory`
    (kind's kubeconfig embeds them: certificate-authority-data, client-certificate/key-data)."""
    doc = yaml.safe_load(kubeconfig.read_text())
    context = next(c["context"] for c in doc["contexts"] if c["name"] == doc["current-context"])
    cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in doc["users"] if u["name"] == context["user"])
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for key, source, field in (
        ("ca", cluster, "certificate-authority"),
        ("cert", user, "client-certificate"),
        ("key", user, "client-key"),
    ):
        path = directory / f"{key}.pem"
        if source.get(f"{field}-data"):
            path.write_bytes(base64.b64decode(source[f"{field}-data"]))
            path.chmod(0o600)
        elif source.get(field):
            path = Path(source[field])
        else:
            raise LookupError(f"{kubeconfig}: no {field} in the current context")
        files[key] = path
    server = urllib.parse.urlsplit(cluster["server"])
    if server.scheme != "https" or not server.hostname:
        raise LookupError(f"{kubeconfig}: server {cluster['server']!r} is not https://host:port")
    return ApiAccess(
        host_port=server.netloc,
        kubeconfig=kubeconfig,
        ca_file=files["ca"],
        cert_file=files["cert"],
        key_file=files["key"],
    )


def chart_monitors(objects: Iterable[Obj]) -> dict[str, Obj]:
    """The rendered chart's ServiceMonitor and PodMonitor objects, by kind (one of each at most)."""
    found: dict[str, Obj] = {}
    for obj in objects:
        if obj.get("apiVersion") == MONITOR_API and obj.get("kind") in (
            "ServiceMonitor",
            "PodMonitor",
        ):
            if obj["kind"] in found:
                raise ValueError(f"the chart renders more than one {obj['kind']}")
            found[obj["kind"]] = obj
    return found


def _label(name: str) -> str:
    """A label key as Prometheus spells it in meta labels (`pdmtp.io/role` -> `pdmtp_io_role`)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _selector_relabels(selector: Mapping[str, Any], prefix: str) -> list[Obj]:
    """A label selector as keep rules on discovered objects' labels (the Prometheus Operator's)."""
    rules: list[Obj] = []
    for key, value in (selector.get("matchLabels") or {}).items():
        rules.append(
            {"action": "keep", "source_labels": [f"{prefix}_label_{_label(key)}"], "regex": value}
        )
    for expr in selector.get("matchExpressions") or []:
        present = f"{prefix}_labelpresent_{_label(expr['key'])}"
        value_label = f"{prefix}_label_{_label(expr['key'])}"
        operator = expr["operator"]
        if operator == "Exists":
            rules.append({"action": "keep", "source_labels": [present], "regex": "true"})
        elif operator == "DoesNotExist":
            rules.append({"action": "drop", "source_labels": [present], "regex": "true"})
        elif operator in ("In", "NotIn"):
            rules.append(
                {
                    "action": "keep" if operator == "In" else "drop",
                    "source_labels": [value_label],
                    "regex": "|".join(re.escape(v) for v in expr["values"]),
                }
            )
        else:
            raise ValueError(f"selector operator {operator!r}")
    return rules


def _snake(rule: Mapping[str, Any]) -> Obj:
    """A monitor's RelabelConfig (camelCase, as the CRD spells it) as Prometheus' (snake_case)."""
    return {re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower(): value for key, value in rule.items()}


def _through_api(api: ApiAccess, metrics_path: list[Obj]) -> list[Obj]:
    """Relabel rules that send the scrape to the API server: the path first (it reads the pod's
    meta labels), then the address."""
    return [
        *metrics_path,
        {"target_label": "__address__", "replacement": api.host_port},
        {"target_label": "__scheme__", "replacement": "https"},
    ]


def _job(
    name: str,
    api: ApiAccess,
    role: str,
    namespaces: Iterable[str],
    relabels: list[Obj],
    endpoint: Mapping[str, Any],
) -> Obj:
    return {
        "job_name": name,
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "scheme": "https",
        "tls_config": api.tls_config(),
        "kubernetes_sd_configs": [
            {
                "role": role,
                "kubeconfig_file": str(api.kubeconfig),
                "namespaces": {"names": sorted(set(namespaces))},
            }
        ],
        "relabel_configs": [*relabels, *(_snake(r) for r in endpoint.get("relabelings") or [])],
        "metric_relabel_configs": [_snake(r) for r in endpoint.get("metricRelabelings") or []],
    }


def service_monitor_job(monitor: Obj, api: ApiAccess, namespace: str) -> Obj:
    """The scrape job of the chart's ServiceMonitor (its one endpoint), the operator's pods
    reached directly through the pod proxy on the endpoint's target port."""
    spec = monitor["spec"]
    (endpoint,) = spec["endpoints"]
    pre = "__meta_kubernetes_service"
    relabels = [
        *_selector_relabels(spec["selector"], pre),
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_endpointslice_port_name"],
            "regex": endpoint["port"],
        },
        # The Prometheus Operator's target labels for a ServiceMonitor.
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": [f"{pre}_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": [f"{pre}_name"], "target_label": "job"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
        {"source_labels": ["__address__"], "target_label": "instance"},
    ]
    path = endpoint.get("path", "/metrics")
    via_api = _through_api(
        api,
        [
            {
                "source_labels": [
                    "__meta_kubernetes_namespace",
                    "__meta_kubernetes_pod_name",
                    "__meta_kubernetes_endpointslice_port",
                ],
                "regex": "(.+);(.+);(.+)",
                "target_label": "__metrics_path__",
                "replacement": f"/api/v1/namespaces/$1/pods/$2:$3/proxy{path}",
            }
        ],
    )
    name = f"serviceMonitor/{namespace}/{monitor['metadata']['name']}/0"
    return _job(name, api, "endpointslice", [namespace], [*relabels, *via_api], endpoint)


def pod_monitor_job(
    monitor: Obj, api: ApiAccess, namespaces: Iterable[str], relay_namespace: str
) -> Obj:
    """The scrape job of a PodMonitor (its one endpoint): each pod through the relay pod in
    `relay_namespace` (/pods/<pod IP>/<port><path>)."""
    spec = monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    pre = "__meta_kubernetes_pod"
    relabels = [
        *_selector_relabels(spec["selector"], pre),
        {"action": "drop", "source_labels": [f"{pre}_phase"], "regex": "(Failed|Succeeded)"},
        {"action": "drop", "source_labels": [f"{pre}_ip"], "regex": ""},
        {
            "action": "keep",
            "source_labels": [f"{pre}_container_port_name"],
            "regex": endpoint["port"],
        },
        # The Prometheus Operator's target labels for a PodMonitor.
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": [f"{pre}_name"], "target_label": "pod"},
        {"source_labels": [f"{pre}_container_name"], "target_label": "container"},
        {
            "target_label": "job",
            "replacement": f"{relay_namespace}/{monitor['metadata']['name']}",
        },
        {"target_label": "endpoint", "replacement": endpoint["port"]},
        {"source_labels": ["__address__"], "target_label": "instance"},
        *(
            {"source_labels": [f"{pre}_label_{_label(key)}"], "target_label": _label(key)}
            for key in spec.get("podTargetLabels") or []
        ),
    ]
    path = endpoint.get("path", "/metrics")
    relay = f"/api/v1/namespaces/{relay_namespace}/pods/{RELAY_NAME}:{RELAY_PORT}/proxy"
    via_api = _through_api(
        api,
        [
            {
                "source_labels": [f"{pre}_ip", f"{pre}_container_port_number"],
                "regex": "(.+);(.+)",
                "target_label": "__metrics_path__",
                "replacement": f"{relay}/pods/$1/$2{path}",
            }
        ],
    )
    name = f"podMonitor/{relay_namespace}/{monitor['metadata']['name']}/0"
    return _job(name, api, "pod", namespaces, [*relabels, *via_api], endpoint)


def shortened_rules(rules: Obj, for_: str = SHORT_FOR) -> Obj:
    """The rule groups with every non-zero `for` (and keep_firing_for) set to `for_` and each
    group evaluated every INTERVAL_SECONDS."""
    out: Obj = json.loads(json.dumps(rules))
    for group in out["groups"]:
        group["interval"] = f"{INTERVAL_SECONDS}s"
        for rule in group["rules"]:
            for key in ("for", "keep_firing_for"):
                if rule.get(key) not in (None, "0", "0s", "0m"):
                    rule[key] = for_
    return out


def without_grafana_variables(expr: str) -> str:
    """An expression Prometheus parses: Grafana's interval variables as 5m, others as a word."""
    expr = re.sub(r"\$\{?__(rate_interval|interval|range)(?:_ms|_s)?\}?", "5m", expr)
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", "grafana_variable", expr)


def selector_names(ast: Any) -> set[str]:
    """Metric names of the selectors in a parsed expression (/api/v1/parse_query's tree)."""
    names: set[str] = set()
    if isinstance(ast, dict):
        if ast.get("type") in ("vectorSelector", "matrixSelector"):
            name = ast.get("name") or next(
                (
                    m["value"]
                    for m in ast.get("matchers") or []
                    if m["name"] == "__name__" and m["type"] == "="
                ),
                "",
            )
            if name:
                names.add(name)
        for value in ast.values():
            names |= selector_names(value)
    elif isinstance(ast, list):
        for value in ast:
            names |= selector_names(value)
    return names


# ---- the shell: the relay pod, the Prometheus process, its HTTP API ----------------------------


def relay_objects(namespace: str, image: str) -> list[Obj]:
    """The relay's ConfigMap (its source) and pod, labelled as a metrics scraper."""
    command = ["python", "/relay/scrape_relay.py", f"--listen-port={RELAY_PORT}"]
    command += [f"--port-allowed={port}" for port in WORKLOAD_METRICS_PORTS]
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": RELAY_NAME, "namespace": namespace},
            "data": {"scrape_relay.py": RELAY_SOURCE.read_text()},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": RELAY_NAME,
                "namespace": namespace,
                "labels": {
                    "pdmtp.io/metrics-scraper": "true",
                    "app.kubernetes.io/name": RELAY_NAME,
                },
            },
            "spec": {
                "enableServiceLinks": False,
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "relay",
                        "image": image,
                        "command": command,
                        "ports": [{"name": "http", "containerPort": RELAY_PORT}],
                        "readinessProbe": {
                            "tcpSocket": {"port": RELAY_PORT},
                            "periodSeconds": 1,
                        },
                        "resources": {"requests": {"cpu": "10m"}},
                        "volumeMounts": [{"name": "source", "mountPath": "/relay"}],
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
                "volumes": [{"name": "source", "configMap": {"name": RELAY_NAME}}],
            },
        },
    ]


def start_relay(kind: Kind, namespace: str) -> None:
    for obj in relay_objects(namespace, kind.images.emulator):
        kind.apply(obj, namespace)
    kind.kubectl(
        "-n",
        namespace,
        "wait",
        "--for=condition=Ready",
        f"pod/{RELAY_NAME}",
        "--timeout=120s",
        timeout=150,
    )


@dataclass
class Prometheus:
    """A prometheus process on 127.0.0.1 and the few API calls the alert test makes."""

    url: str
    process: subprocess.Popen[bytes]
    directory: Path

    @classmethod
    def start(cls, binary: Path, directory: Path, config: Obj, rules: Obj) -> Prometheus:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
        config = {**config, "rule_files": [str(directory / "rules.yaml")]}
        (directory / "prometheus.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (port,) = free_ports(1)
        log = (directory / "prometheus.log").open("wb")
        process = subprocess.Popen(
            [
                str(binary),
                f"--config.file={directory / 'prometheus.yaml'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        prometheus = cls(f"http://127.0.0.1:{port}", process, directory)
        try:
            wait_for(prometheus.ready, "prometheus ready", timeout=60, every=0.5)
        except TimeoutError:
            prometheus.stop()
            raise AssertionError(f"prometheus did not start:\n{prometheus.log_tail()}") from None
        return prometheus

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited {self.process.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def log_tail(self, lines: int = 40) -> str:
        path = self.directory / "prometheus.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as answer:
            body = json.load(answer)
        if body.get("status") != "success":
            raise AssertionError(f"/api/v1/{path}: {body}")
        return body["data"]

    def firing(self) -> list[Obj]:
        """The alerts firing now, each as its labels."""
        return [a["labels"] for a in self.api("alerts")["alerts"] if a["state"] == "firing"]

    def firing_for(self, alert: str, **labels: str) -> list[Obj]:
        return [
            a
            for a in self.firing()
            if a.get("alertname") == alert and all(a.get(k) == v for k, v in labels.items())
        ]

    def wait_evaluated(self, seconds: float) -> None:
        """Wait until every rule group has evaluated at least `seconds` from now."""
        after = time.time() + seconds

        def evaluated() -> bool:
            groups = self.api("rules")["groups"]
            return bool(groups) and all(
                _epoch(g.get("lastEvaluation", "")) >= after for g in groups
            )

        wait_for(evaluated, f"rule evaluations {seconds:.0f} s on", seconds + 30, every=0.5)

    def metric_names(self) -> set[str]:
        """Every metric name Prometheus holds a series of."""
        return set(self.api("label/__name__/values"))

    def parsed_names(self, expr: str) -> set[str]:
        """The metric names an expression selects, by Prometheus' own parser."""
        return selector_names(self.api("parse_query", query=expr))

    def active_targets(self) -> list[Obj]:
        targets: list[Obj] = self.api("targets", state="active")["activeTargets"]
        return targets


def monitors(helm: Path) -> dict[str, Obj]:
    """The chart's monitors as an install with the Prometheus Operator's API renders them."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    toggles = [
        f"metrics.{key}.enabled=true"
        for key, value in (values.get("metrics") or {}).items()
        if key.endswith("Monitor") and isinstance(value, dict) and "enabled" in value
    ]
    objects = render(
        helm,
        "--api-versions",
        f"{MONITOR_API}/ServiceMonitor",
        "--api-versions",
        f"{MONITOR_API}/PodMonitor",
        sets=toggles,
    )
    return chart_monitors(objects)


def scrape_config(found: Mapping[str, Obj], api: ApiAccess, workload_namespaces: list[str]) -> Obj:
    """The whole configuration: the operator's ServiceMonitor, the workloads' PodMonitor (the
    chart's, or ENGINE_MONITOR), the relay in the first of `workload_namespaces`."""
    if "ServiceMonitor" not in found:
        raise LookupError("the chart renders no ServiceMonitor for the operator")
    engines = found.get("PodMonitor", ENGINE_MONITOR)
    return {
        "global": {
            "scrape_interval": f"{INTERVAL_SECONDS}s",
            "scrape_timeout": f"{INTERVAL_SECONDS}s",
            "evaluation_interval": f"{INTERVAL_SECONDS}s",
        },
        "scrape_configs": [
            service_monitor_job(found["ServiceMonitor"], api, NAMESPACE),
            pod_monitor_job(engines, api, workload_namespaces, workload_namespaces[0]),
        ],
    }


def prometheus_binary() -> Path:
    """PDMTP_PROMETHEUS_DIR's prometheus (hack/kind-e2e.sh sets it: hack/prometheus/build.sh)."""
    directory = os.environ.get("PDMTP_PROMETHEUS_DIR")
    if not directory:
        raise LookupError("PDMTP_PROMETHEUS_DIR is unset (hack/kind-e2e.sh sets it)")
    binary = Path(directory) / "prometheus"
    if not os.access(binary, os.X_OK):
        raise LookupError(f"no prometheus at {binary} (hack/prometheus/build.sh builds it)")
    return binary


def _epoch(stamp: str) -> float:
    """An RFC 3339 time of the API (nanoseconds) in seconds; 0 for none."""
    if not stamp or stamp.startswith("0001-"):
        return 0.0
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", stamp)).timestamp()
