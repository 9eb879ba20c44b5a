"""Every command README.md and the docs it sends a user to show, and the test that runs it (or
why none can, here). The documents are `DOCUMENTS`: README.md and docs/guide.md, operations.md and
testing.md, where the README's details moved.

A command is a line of a fenced `sh` block (continuations joined, the trailing comment dropped),
a `$ ` line of a `console` block, or inline code that starts with `make <target>`, `pdmtp <sub>`,
`kubectl`, `helm`, `kustomize`, `docker`, `export` or a `hack/` script (optionally after
`VAR=value` assignments). Placeholders are spelt one way: `$REG` -> `<REG>`, `NAME` -> `<NAME>`.

`REGISTRY` maps each to the pytest node ids that run it (the same binary, subcommand and flags on
the same kind of input; `how` says where a test differs) or to `why_not`, the reason it cannot run
on this machine and what runs instead. tests/unit/test_readme_commands.py fails when a document
shows a command the registry lacks, when the registry names a command no document shows any more
or a test that does not exist, and when docs/readme-commands.md is not `table()`:

    .venv/bin/python tests/unit/readme_commands.py > docs/readme-commands.md
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCUMENTS = (
    README,
    REPO / "docs" / "guide.md",
    REPO / "docs" / "operations.md",
    REPO / "docs" / "testing.md",
)
"""The README and the pages it moved its details to: every command in them is under a test."""

_FENCE = re.compile(r"^```(\S*)\s*$")
_INLINE = re.compile(r"`([^`\n]+)`")
_ASSIGNMENTS = r"(?:[A-Z_][A-Z0-9_]*=\S+ )*"
_INLINE_COMMAND = re.compile(
    _ASSIGNMENTS + r"(?:make [a-z]|pdmtp (?:-|[a-z])|kubectl |helm |kustomize |docker |export "
    r"|hack/\S+\.(?:sh|py)\b)"
)
_PLACEHOLDERS = ("NAME", "FILE", "OLD", "NEW", "ADDR", "PORT", "S", "N")


def _strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a `#` outside quotes, after a blank)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def normalise(command: str) -> str:
    """One spelling per command: blanks collapsed, `$VAR` and bare placeholders as `<VAR>`."""
    out = " ".join(command.split())
    out = re.sub(r"\$\{?([A-Z][A-Z0-9_]*)\}?", r"<\1>", out)
    words = "|".join(_PLACEHOLDERS)
    return re.sub(rf"(?<![\w<$=./-])({words})(?![\w=>])", r"<\1>", out)


def extract(text: str) -> list[str]:
    """README.md's commands, normalised, each once, in order of first appearance."""
    found: list[str] = []
    fence: str | None = None
    pending = ""
    for line in text.splitlines():
        opened = _FENCE.match(line)
        if opened:
            fence = None if fence is not None else opened.group(1)
            pending = ""
            continue
        if fence in ("sh", "bash", "shell"):
            code = _strip_comment(pending + line).rstrip()
            if code.endswith("\\"):
                pending = code[:-1] + " "
                continue
            pending = ""
            if code.strip():
                found.append(code)
        elif fence == "console":
            if line.startswith("$ "):
                found.append(line[2:])
        elif fence is None:
            found += [c for c in _INLINE.findall(line) if _INLINE_COMMAND.match(c)]
    return list(dict.fromkeys(normalise(c) for c in found))


def shown_in() -> dict[str, list[str]]:
    """Each documented command and the documents (paths from the repository) that show it."""
    where: dict[str, list[str]] = {}
    for document in DOCUMENTS:
        for command in extract(document.read_text(encoding="utf-8")):
            where.setdefault(command, []).append(str(document.relative_to(REPO)))
    return where


def readme_commands() -> list[str]:
    """Every command the documents show, each once, README.md's first."""
    return list(shown_in())


@dataclass(frozen=True)
class Run:
    """A command some tests run. `how`: where they differ from the README's line, if at all."""

    tests: tuple[str, ...]
    how: str = ""


@dataclass(frozen=True)
class NotRun:
    """A command no test can run on this machine, and what runs in its place."""

    why_not: str


@dataclass(frozen=True)
class ByMake:
    """A command `make test` (what .ci/run runs) runs itself: a tier, a lint step or a build.
    `evidence`: a file and the text in it that makes it so (the unit test checks it is there)."""

    how: str
    evidence: tuple[str, str]


Entry = Run | NotRun | ByMake

CLUSTER = "tests/cluster"
DEMO = f"{CLUSTER}/test_demo.py::test_make_demo_then_demo_down"
WALK = f"{CLUSTER}/test_readme_walkthrough.py"
APPLY_GET = f"{WALK}::test_a_pddeployment_file_applied_listed_watched_and_described"
SNAPSHOT = f"{WALK}::test_the_corev1_snapshot_is_what_the_pinned_api_server_serves"
EXAMPLES = "tests/unit/test_readme_examples.py"
INSTALL = f"{CLUSTER}/test_install.py::test_deleting_the_crd_is_refused_until_annotated"
CHART = (
    f"{CLUSTER}/test_chart.py::test_install_upgrade_uninstall_keeps_the_crds_and_purge_removes_them"
)
ROLL = f"{CLUSTER}/test_rollout_control.py"
VERIFY_CANARY = (
    "tests/cluster/test_verification.py::"
    "test_a_canary_that_accepts_fewer_drafts_is_rolled_back_and_a_healthy_one_promotes_itself"
)
CANARY = f"{ROLL}::test_a_canary_holds_at_its_share_until_promoted"
UNDO = f"{ROLL}::test_undo_returns_to_a_recorded_revision"
PAUSE = f"{ROLL}::test_pause_freezes_a_rollout_and_resume_finishes_it"
AUTOSCALE = f"{CLUSTER}/test_autoscaling.py"
ELASTIC = (
    f"{AUTOSCALE}::"
    "test_load_scales_both_roles_up_within_the_band_holds_on_stale_metrics_and_scales_down"
)
EXTERNAL = f"{AUTOSCALE}::test_kubectl_scale_on_an_external_roles_scale_endpoint_changes_that_role"
CREATE = f"{CLUSTER}/test_operator.py::test_create_becomes_available_matching_render"
DRAIN = (
    f"{CLUSTER}/test_budgets.py::"
    "test_budgets_refuse_a_drain_beyond_the_allowance_and_never_hold_the_operator"
)
UPGRADE = "tests/e2e/test_upgrade.py"
OPERATOR_IMAGE = "tests/images/test_operator_image.py"
NO_DOCKER = (
    "no Docker engine and no registry on this machine; the images tier builds the same "
    "Dockerfile with podman on locally built bases (hack/lib/build_images.py, `make images`) "
    "and runs the image"
)


WALK_CANARY_PATCH = (
    "kubectl patch pdd demo --type merge -p "
    """'{"spec":{"speculative":{"numSpeculativeTokens":3},"rollout":{"canary":{"percent":50}}}}'"""
)


def _tier(target: str, what: str) -> ByMake:
    return ByMake(f"a step of `make test`: {what}", ("Makefile", target))


REGISTRY: dict[str, Entry] = {
    # ---- Two commands
    "pdmtp run --leader-elect": Run(
        (
            f"{CLUSTER}/test_leader_election.py::"
            "test_a_frozen_leader_is_replaced_and_writes_nothing_after_it_wakes",
            "tests/cluster/test_operator.py::test_operator_killed_mid_roll_finishes_it_after_restart",
        ),
        "two replicas with --leader-election-namespace and short lease timings",
    ),
    "kubectl get lease -n pdmtp-system pdmtp-operator": Run(
        (
            "tests/e2e/test_install.py::"
            "test_operator_runs_in_cluster_from_deploy_with_its_own_identity",
            "tests/e2e/test_operator_failover.py::test_1_the_leaders_pod_deleted_mid_roll",
        ),
        "Kind.operator_leader runs it with -o json and reads the holder",
    ),
    "make demo": Run((DEMO,), "runs `make demo DEMO_DIR=<tmp>`: the demo's state in its own dir"),
    "make demo DEMO_DIR=/tmp/demo2": Run((DEMO,), "with DEMO_DIR a temporary directory"),
    "make test": ByMake(
        "what CI runs (.ci/run); a test cannot run the suite it belongs to (over an hour)",
        (".ci/run", "exec make test"),
    ),
    "kubectl get pdd,deploy,pods": Run((DEMO,), "hack/demo.sh runs it (with -o wide)"),
    "export KUBECONFIG=...": Run(
        (DEMO,), "the test asserts the line `make demo` prints and reads the cluster through it"
    ),
    "make demo-down": Run((DEMO,), "then asserts nothing the demo started still runs"),
    "make chart-check": ByMake(
        "the cluster lane of `make test` runs it before the cluster tier (it needs the "
        "control plane's kubectl, so lint does not wait for that build)",
        ("Makefile", "chart-check"),
    ),
    "make test-unit": _tier("test-unit", "the unit tier"),
    "make test-router": _tier("test-router", "the router tier"),
    "make test-cluster": _tier("test-cluster", "the cluster tier"),
    "kubectl scale": Run((EXTERNAL,), "`kubectl scale pdrolescale <name>-decode --replicas=4`"),
    "kubectl drain": Run(
        (
            DRAIN,
            f"{CLUSTER}/test_multinode.py::test_groups_serve_whole_recover_whole_roll_and_scale_by_groups",
        ),
        "the Eviction API (policy/v1) `kubectl drain` calls for each pod, pod by pod: one "
        "evicted, the next refused until its replacement is Ready; no node is cordoned (KWOK's "
        "nodes run no kubelet to drain)",
    ),
    "make test-engine": _tier("test-engine", "the engine tier"),
    "make test-pd-cpu": _tier("test-pd-cpu", "the CPU P/D tier"),
    "make pd-cpu-accuracy": NotRun(
        "~70 min of engines on two cores (15 cases of ~4.5 min), too long for CI; the CPU P/D "
        "tier runs its k=2 and k=3 cells (one engine against the fixed pair, request by request, "
        "and the stock pair) in tests/pd_cpu/test_pd_pair.py and test_stock_connector.py, with "
        "the same code "
        "(tests/pd_cpu/acceptance.py, fleet.serve_all)"
    ),
    "pdmtp render": Run(
        (
            "tests/unit/test_cli.py::test_render_prints_every_child",
            f"{EXAMPLES}::test_validate_and_render_the_production_sample",
        )
    ),
    "make test-images": _tier("test-images", "the images tier"),
    "make test-lanes": _tier(
        "test-lanes",
        "the cluster and images tiers beside kind, the engine and CPU P/D tiers niced beside both",
    ),
    "hack/lanes.sh": ByMake(
        "`make test-lanes` runs it: three lanes, the engine and CPU P/D tiers niced",
        ("Makefile", "test-lanes"),
    ),
    "make kind-e2e": _tier("kind-e2e", "the kind tier"),
    "make test-keda": _tier("test-keda", "the KEDA test, last"),
    "hack/prebuild.sh": ByMake(
        "`make test` runs the tiers under hack/with-prebuild.sh, which starts it in the background",
        ("hack/with-prebuild.sh", "hack/prebuild.sh"),
    ),
    "hack/lift-prebuild.sh": Run(
        (
            "tests/unit/test_ci_scripts.py::test_waiting_for_a_lock_the_background_builds_hold_lifts_them",
            "tests/unit/test_ci_scripts.py::test_a_lock_another_tier_holds_lifts_nothing",
            "tests/unit/test_ci_scripts.py::test_a_pid_that_is_not_the_background_builds_is_left_alone",
        ),
        "against a niced stand-in for the background builds; in `make test`, a lock waiter runs it",
    ),
    # ---- Install on a real cluster: 1. images
    "set -a && . ./versions.env && set +a": Run(
        (f"{EXAMPLES}::test_the_image_build_variables",),
        "in bash from the repository root; the engine's build args come out exported",
    ),
    "docker build --build-arg VLLM_VERSION --build-arg MOONCAKE_VERSION "
    "-t <REG>/pdmtp-engine:0.33.0 images/engine": NotRun(
        f"{NO_DOCKER}: tests/images/test_engine_image.py (its build args from versions.env)"
    ),
    "docker build -t <REG>/pdmtp-router:0.1.17 images/router": NotRun(
        f"{NO_DOCKER}: tests/images/test_router_image.py"
    ),
    "VERSION=$(sed -n 's/^version = \"\\(.*\\)\"/\\1/p' pyproject.toml)": Run(
        (f"{EXAMPLES}::test_the_image_build_variables",),
        "in bash from the repository root: VERSION is pdmtp's own version",
    ),
    "docker build -f images/operator/Dockerfile --build-arg PDMTP_VERSION=<VERSION> "
    "-t <REG>/pdmtp-operator:<VERSION> .": NotRun(
        f"{NO_DOCKER}, with the build arg PDMTP_VERSION and the tag :<VERSION>: "
        f"{OPERATOR_IMAGE}::test_the_image_carries_the_release_version"
    ),
    "docker push <REG>/pdmtp-engine:0.33.0 <REG>/pdmtp-router:0.1.17 "
    "<REG>/pdmtp-operator:<VERSION>": NotRun(
        "no registry reachable from this machine (loopback only); the kind tier loads the "
        "podman-built images into the node instead (hack/kind-e2e.sh)"
    ),
    # 2. install
    "cd deploy/operator && kustomize edit set image pdmtp-operator=<REG>/pdmtp-operator:<VERSION>"
    " && cd -": NotRun(
        "no kustomize binary here (kubectl embeds kustomize's build, not its `edit`); the kind "
        "tier installs deploy/ through an overlay whose `images:` entry is what `kustomize edit "
        "set image` writes (hack/kind-e2e.sh install_pdmtp, tests/e2e/test_upgrade.py)"
    ),
    "kubectl apply --server-side -k deploy/": Run(
        (
            INSTALL,
            f"{UPGRADE}::test_kustomize_upgrade_then_uninstall_and_purge",
        ),
        "test_install.py's `installed` fixture applies deploy/ itself; kind: an overlay of "
        "deploy/ that only swaps the operator image",
    ),
    "hack/wait-crds.sh pddeployments.pdmtp.io pdrolescales.pdmtp.io": Run(
        (INSTALL, DEMO),
        "test_install.py's `installed` fixture runs it right after the kubectl install; "
        "hack/demo.sh after applying crds/ (with --timeout)",
    ),
    # 3. check and apply
    "pdmtp validate samples/full.yaml": Run((f"{EXAMPLES}::test_validate_the_full_sample",)),
    "pdmtp render samples/multinode.yaml": Run(
        (f"{EXAMPLES}::test_render_the_multinode_sample_shows_groups_ranks_and_gangs",)
    ),
    "kubectl create namespace serving": Run(
        (APPLY_GET,), "the namespace fixture creates the test's namespace through the API"
    ),
    "kubectl apply -f samples/full.yaml": Run(
        (APPLY_GET,), "the sample with metadata.namespace set to the test's namespace"
    ),
    "kubectl wait --for=condition=Available pdd/inkling -n serving --timeout=30m": Run(
        (CREATE, DEMO),
        "on pdd/demo (--timeout=20s; the demo's 180s): samples/full.yaml as written never "
        "becomes Available on fake nodes (an H200 nodeSelector), as the README says to edit it",
    ),
    "kubectl get pdd -n serving": Run(
        (APPLY_GET,), "in the test's namespace; the header is the README comment's columns"
    ),
    # 4. change the MTP config
    "pdmtp plan --from samples/full.yaml --to new.yaml": Run(
        (f"{EXAMPLES}::test_plan_from_the_full_sample_to_a_changed_mtp_config",),
        "new.yaml: the sample with numSpeculativeTokens 2",
    ),
    "kubectl apply -f new.yaml && kubectl get pdd -n serving -w": Run(
        (APPLY_GET,), "the watch read until it shows the applied change, then stopped"
    ),
    "kubectl describe pdd inkling -n serving": Run((APPLY_GET,), "with the operator's events"),
    # ---- Install with Helm
    "make lint": _tier("lint", "first"),
    "helm template": Run(
        ("tests/unit/test_chart.py::test_defaults_watch_every_namespace_with_one_cluster_binding",),
        "`helm template pdmtp charts/pdmtp -n pdmtp-system` (hack/lib/chart.py)",
    ),
    "kubectl kustomize deploy/": ByMake(
        "hack/chart-check.py (`make chart-check`, in `make test`) compares it with helm template",
        ("hack/chart-check.py", '"kustomize"'),
    ),
    "helm install pdmtp charts/pdmtp -n pdmtp-system --create-namespace "
    "--set image.repository=<REG>/pdmtp-operator": Run(
        (CHART,),
        "its purge step installs with these flags in the test's namespace and checks the tag "
        "defaults to the chart's appVersion",
    ),
    "helm upgrade pdmtp charts/pdmtp -n pdmtp-system --reuse-values --set logLevel=debug": Run(
        (CHART,), "with --force-conflicts and a second --set (after the kubectl install)"
    ),
    "helm upgrade": Run((CHART,)),
    "make generate": Run(
        (f"{EXAMPLES}::test_make_generate_in_a_scratch_copy",),
        "the target run in a scratch directory holding what it writes; the result equals the tree",
    ),
    "make verify": Run((f"{EXAMPLES}::test_make_verify",)),
    "helm uninstall": Run((CHART,)),
    "helm upgrade pdmtp charts/pdmtp -n pdmtp-system --reuse-values --set crds.keep=false": Run(
        (CHART, f"{UPGRADE}::test_helm_upgrade_then_uninstall_and_purge")
    ),
    "helm uninstall pdmtp -n pdmtp-system": Run(
        (CHART, f"{UPGRADE}::test_helm_upgrade_then_uninstall_and_purge"),
        "the cluster test adds --wait",
    ),
    "kubectl apply -k deploy/": Run(
        (INSTALL,), "server-side, as the install step and deploy/kustomization.yaml say"
    ),
    "helm install --take-ownership": Run((CHART,), "with --force-conflicts, as the README says"),
    # ---- Upgrade
    "pdmtp --version": Run(
        (
            f"{EXAMPLES}::test_version_prints_the_project_version",
            f"{OPERATOR_IMAGE}::test_the_image_carries_the_release_version",
        )
    ),
    "helm upgrade pdmtp charts/pdmtp -n pdmtp-system --reuse-values": Run(
        (CHART, f"{UPGRADE}::test_helm_upgrade_then_uninstall_and_purge"),
        "the cluster test: exactly, after its other upgrade; kind: from the previous release's "
        "chart, the image set instead of --reuse-values",
    ),
    "kubectl apply": Run((APPLY_GET,)),
    # ---- Uninstall
    "kubectl delete -k deploy/operator/": Run(
        (
            INSTALL,
            f"{UPGRADE}::test_kustomize_upgrade_then_uninstall_and_purge",
        ),
        "the cluster test with --dry-run=server; kind: for real, on the overlay of deploy/operator",
    ),
    "kubectl delete crd pddeployments.pdmtp.io": Run(
        (
            INSTALL,
            f"{UPGRADE}::test_kustomize_upgrade_then_uninstall_and_purge",
        ),
        "refused by the guard: the cluster test with --dry-run=server (admission runs), "
        "kind for real",
    ),
    "kubectl annotate crd pddeployments.pdmtp.io pdrolescales.pdmtp.io "
    "pdmtp.io/allow-delete=true": Run(
        (f"{UPGRADE}::test_kustomize_upgrade_then_uninstall_and_purge",),
        "with --overwrite; the cluster tier's test_install annotates one CRD and dry-runs "
        "the delete",
    ),
    "kubectl delete -k deploy/": Run(
        (f"{UPGRADE}::test_kustomize_upgrade_then_uninstall_and_purge",),
        "kind: on the overlay of deploy/ that swaps the operator image, with --ignore-not-found",
    ),
    # ---- Health, admission, kind
    "pdmtp run --webhook-listen <ADDR>:<PORT> --webhook-manage": Run(
        (f"{CLUSTER}/test_webhook.py::test_incompatible_spec_is_refused_at_admission",),
        "the harness's OperatorProcess(webhook=True) on 127.0.0.1",
    ),
    "pdmtp validate <FILE>": Run(
        (
            "tests/unit/test_cli.py::test_samples_validate",
            f"{EXAMPLES}::test_validate_the_full_sample",
        )
    ),
    "hack/corev1-snapshot.py": Run(
        (SNAPSHOT,),
        "as written (its own control plane), in a scratch tree holding the script, so that "
        "the corev1.json it writes lands there; equal to the committed one",
    ),
    "pdmtp validate --server <FILE>": Run(
        (
            f"{CLUSTER}/test_pod_admission.py::test_the_crd_and_validate_refuse",
            f"{CLUSTER}/test_pod_admission.py::test_without_the_webhook_the_crd_stores_it",
        ),
        "with --kubeconfig and -n",
    ),
    "hack/kind/build-node-image.sh": ByMake(
        "`make kind-e2e` (hack/kind-e2e.sh) builds the node image with it",
        ("hack/kind-e2e.sh", "NODE_IMAGE=$(hack/kind/build-node-image.sh)"),
    ),
    "hack/lib/kind_overlay.py": ByMake(
        "`make kind-e2e` (hack/kind-e2e.sh) writes the overlay it installs pdmtp through with it",
        ("hack/kind-e2e.sh", '"$PY" hack/lib/kind_overlay.py "$overlay"'),
    ),
    "hack/kind/pod-network.sh": ByMake(
        "`make kind-e2e` (hack/kind-e2e.sh) runs it right after creating the cluster",
        ("hack/kind-e2e.sh", 'hack/kind/pod-network.sh "$KUBECTL"'),
    ),
    "KIND_E2E_RUNTIME=docker hack/kind-e2e.sh": NotRun(
        "no Docker engine and no registry here (the README says this path has not been run); "
        "`make kind-e2e` runs the same script and tests on podman"
    ),
    "pdmtp validate": Run(("tests/unit/test_cli.py::test_samples_validate",)),
    "pdmtp plan": Run(("tests/unit/test_cli.py::test_plan_prints_the_paired_roll",)),
    # ---- Rollouts
    "kubectl pdmtp rollout ...": Run(
        (UNDO,), "`kubectl pdmtp rollout history`: kubectl finds the kubectl-pdmtp plugin on PATH"
    ),
    "pdmtp rollout status <NAME> [--timeout <S>]": Run((CANARY, PAUSE)),
    "pdmtp rollout pause <NAME>": Run((PAUSE,), "and `resume`"),
    "pdmtp rollout promote <NAME>": Run((CANARY,)),
    "pdmtp verify <NAME>": Run((VERIFY_CANARY,), "exit 0 when Verified, 1 once Failed"),
    "pdmtp verify": Run((VERIFY_CANARY,)),
    "pdmtp rollout history <NAME>": Run((UNDO,)),
    "pdmtp rollout undo <NAME> [--to-revision <N>]": Run((UNDO,)),
    "pdmtp plan --from <OLD> --to <NEW> [--fail-after <S>]": Run(
        (
            "tests/unit/test_cli.py::test_plan_prints_the_paired_roll",
            f"{EXAMPLES}::test_plan_with_fail_after_prints_the_rollback",
        )
    ),
    "pdmtp rollout promote": Run((CANARY,)),
    "pdmtp plan --from samples/demo.yaml --to new.yaml": Run(
        (f"{EXAMPLES}::test_plan_of_the_canary_example_on_the_demo",),
        "new.yaml: k=2 and canary 50%; checks what the README says it prints",
    ),
    "kubectl apply -f new.yaml": Run((APPLY_GET, DEMO)),
    "pdmtp rollout status demo --timeout 60": Run(
        (CANARY,), "--timeout 2 during the hold (the README's 60 would only wait longer)"
    ),
    "pdmtp rollout promote demo": Run((CANARY,), "on its PDDeployment `canary`"),
    "pdmtp rollout status demo": Run((CANARY,), "with --timeout, so that a failure ends"),
    "pdmtp rollout undo demo": Run((UNDO,), "without --to-revision: back to the previous one"),
    # ---- Autoscaling
    "kubectl get pdd demo -o jsonpath="
    "'{.status.autoscaling.roles[?(@.name==\"decode\")].reason}'": Run(
        (ELASTIC,), "on its PDDeployment `elastic`, once decode has scaled up"
    ),
    "kubectl get events --field-selector reason=AutoscaledUp": Run((ELASTIC,)),
    "kubectl scale pdrolescale demo-decode --replicas 4": Run((EXTERNAL,), "--replicas=4"),
    # ---- Network policy
    "kubectl label namespace monitoring pdmtp.io/metrics-scraper=true": Run(
        (
            "tests/e2e/test_network_policy.py::test_1_only_its_engines_routers_and_scrapers_reach_the_engine_ports",
        ),
        "kind: a scraper namespace labelled so",
    ),
    # ---- Local Kubernetes without Docker
    "make cluster-up": Run(
        (DEMO,),
        "hack/demo.sh runs the target's own command (hack/lib/localcluster.py up --dir) "
        "on DEMO_DIR; the target itself writes .cluster/ in the tree (no directory variable)",
    ),
    "export KUBECONFIG=<PWD>/.cluster/kubeconfig": Run(
        (DEMO,), "the kubeconfig that `localcluster.py up` writes, in DEMO_DIR"
    ),
    "make cluster-down": Run((DEMO,), "likewise: `localcluster.py down --dir` through demo-down"),
    # ---- README: the CLI, the first PDDeployment, troubleshooting
    "pip install .": Run(
        (f"{OPERATOR_IMAGE}::test_the_image_carries_the_release_version",),
        "the operator image's build: `pip wheel .` of the checkout, that wheel pip-installed into "
        "a venv, then the installed `pdmtp --version` run (images/operator/Dockerfile)",
    ),
    "kubectl describe pdd <NAME>": Run((APPLY_GET,), "on its PDDeployment, with the events"),
    "kubectl describe": Run((APPLY_GET,)),
    "pdmtp rollout status": Run((CANARY, PAUSE)),
    "pdmtp rollout status <NAME>": Run((CANARY, PAUSE), "with --timeout, so that a failure ends"),
    "pdmtp rollout resume <NAME>": Run((PAUSE,)),
    "pdmtp rollout undo <NAME>": Run((UNDO,), "without --to-revision: back to the previous one"),
    # ---- docs/testing.md: the new reader's walk-through
    "make demo DEMO_DIR=/tmp/walk": Run((DEMO,), "with DEMO_DIR a temporary directory"),
    "pdmtp verify demo": Run(
        (DEMO,), "hack/demo.sh runs it: exit 0 when Verified, 1 after the worse release's rollback"
    ),
    "hack/lib/demo_engines.py": Run(
        (DEMO,), "hack/demo.sh starts it; the test asks demo-down to stop it with the rest"
    ),
    "pdmtp rollout undo demo --to-revision 2": Run((UNDO,), "on the test's own PDDeployment"),
    "pdmtp rollout undo": Run((UNDO,), "without --to-revision: back to the previous one"),
    "export KUBECONFIG=/tmp/walk/kubeconfig": Run(
        (DEMO,), "the kubeconfig the demo writes in DEMO_DIR, read by the test"
    ),
    "export PATH=<HOME>/.cache/pdmtp/bin/v1.37.2:<PWD>/.venv/bin:<PATH>": Run(
        (DEMO,),
        "the demo runs that kubectl (hack/demo.sh: the bin directory of the pinned Kubernetes, "
        "under PDMTP_CACHE_DIR) and prints its path; .venv/bin holds the pdmtp `make venv` "
        "installs",
    ),
    "kubectl get pdd": Run((APPLY_GET,), "with -n; the header is the columns the README names"),
    "kubectl describe pdd demo": Run(
        (DEMO, APPLY_GET), "hack/demo.sh runs it after the rollout (its events)"
    ),
    "pdmtp rollout history demo": Run((UNDO,), "on its PDDeployment `undo`"),
    WALK_CANARY_PATCH: Run(
        (DEMO, CANARY),
        "hack/demo.sh runs `kubectl patch pdd demo --type merge` with k alone; the canary test "
        "patches k and a 50% canary through the API",
    ),
    "pdmtp rollout status demo --timeout 120": Run((CANARY,), "after the promotion"),
    "make demo-down DEMO_DIR=/tmp/walk": Run((DEMO,), "with DEMO_DIR a temporary directory"),
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table() -> str:
    """docs/readme-commands.md: each README command and what runs it."""
    lines = [
        "<!-- Generated by tests/unit/readme_commands.py; "
        "tests/unit/test_readme_commands.py checks it. -->",
        "<!-- Regenerate: .venv/bin/python tests/unit/readme_commands.py "
        "> docs/readme-commands.md -->",
        "",
        "# Documented commands and the tests that run them",
        "",
        "Every command README.md, docs/guide.md, docs/operations.md and docs/testing.md show "
        "(fenced `sh`/`console` blocks and inline commands, placeholders as `<NAME>`), where, "
        "and the test that runs it, the `make test` step that does, or why nothing can on this "
        "machine. A documented command missing here fails the unit tier.",
        "",
        "| # | command | shown in | run by | how / why not |",
        "|---|---|---|---|---|",
    ]
    where = shown_in()
    for i, (command, entry) in enumerate(REGISTRY.items(), 1):
        if isinstance(entry, Run):
            by, how = "<br>".join(f"`{t}`" for t in entry.tests), entry.how
        elif isinstance(entry, ByMake):
            by, how = "`make test`", f"{entry.how} ({entry.evidence[0]})"
        else:
            by, how = "not run here", entry.why_not
        docs = ", ".join(Path(d).name for d in where.get(command, []))
        lines.append(f"| {i} | `{_cell(command)}` | {docs} | {_cell(by)} | {_cell(how)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
