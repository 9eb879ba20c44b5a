{{/*
Labels every object carries: deploy/'s app.kubernetes.io/part-of plus Helm's own. The names are
fixed (the operator is a cluster singleton), as in deploy/, so an install can move between
`kubectl apply -k deploy/` and this chart.
*/}}
{{- define "pdmtp.labels" -}}
app.kubernetes.io/part-of: pdmtp
{{ include "pdmtp.helmLabels" . }}
{{- end }}

{{/* Helm's own labels (the CRDs carry part-of already: they are generated with it). */}}
{{- define "pdmtp.helmLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The operator's own objects (Deployment, Services): also the selector label of deploy/. */}}
{{- define "pdmtp.operatorLabels" -}}
app.kubernetes.io/name: pdmtp-operator
{{ include "pdmtp.labels" . }}
{{- end }}

{{/* The Deployment's selector: never changes (a selector is immutable). */}}
{{- define "pdmtp.selector" -}}
app.kubernetes.io/name: pdmtp-operator
{{- end }}

{{/*
Annotations of what outlives `helm uninstall` while crds.keep (the CRDs and their guard), and
the CRDs' consent to be deleted when it is off (the guard refuses it otherwise).
*/}}
{{- define "pdmtp.keepAnnotations" -}}
{{- if .Values.crds.keep }}
helm.sh/resource-policy: keep
{{- end }}
{{- end }}

{{- define "pdmtp.webhookService" -}}
pdmtp-operator-webhook
{{- end }}

{{/*
The rules on namespaced kinds: exactly deploy/operator/rbac.yaml's (which
tests/unit/test_kinds.py holds to operator/pdmtp/api/kinds.py; make chart-check holds this to
deploy/).
*/}}
{{- define "pdmtp.namespacedRules" -}}
# The PDDeployments it reconciles: watched, status written by the reconciler.
- apiGroups: ["pdmtp.io"]
  resources: ["pddeployments"]
  verbs: ["list", "watch"]
- apiGroups: ["pdmtp.io"]
  resources: ["pddeployments/status"]
  verbs: ["patch"]
# External-autoscaled roles' scale endpoints.
- apiGroups: ["pdmtp.io"]
  resources: ["pdrolescales"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["pdmtp.io"]
  resources: ["pdrolescales/status"]
  verbs: ["patch"]
# Per-revision workloads and their revision history.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["controllerrevisions"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Engine and router pods (an engine pod leaving is patched, annotations only); a multi-node
# group's pods are created and deleted whole by the operator.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# A multi-node group's gang (Kubernetes Workload API).
- apiGroups: ["scheduling.k8s.io"]
  resources: ["podgroups"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Shared children: the client Service, the routers' ServiceAccount, the NetworkPolicy; a
# multi-node role's headless Service is deleted with its revision.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "watch", "create", "patch"]
# Each (revision, engine role)'s PodDisruptionBudget, deleted with its revision.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/* The cluster-scoped rules: kopf's discovery, and the webhook's configuration when on. */}}
{{- define "pdmtp.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
# Cordoned nodes: a drain's engine pods are moved off them, replacement first.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
{{- if .Values.webhook.enabled }}
# --webhook-manage keeps the ValidatingWebhookConfiguration pdmtp.io up to date.
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["validatingwebhookconfigurations"]
  verbs: ["list", "watch", "create", "patch"]
{{- end }}
{{- end }}
