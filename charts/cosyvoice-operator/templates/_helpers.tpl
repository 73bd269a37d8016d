{{/* Names, labels and the RBAC rules shared by the templates. */}}

{{- define "cosyvoice-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cosyvoice-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "cosyvoice-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cosyvoice-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cosyvoice-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cosyvoice-operator.labels" -}}
helm.sh/chart: {{ include "cosyvoice-operator.chart" . }}
{{ include "cosyvoice-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: cosyvoice-operator
{{- end }}

{{- define "cosyvoice-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cosyvoice-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* imageRegistry without a trailing "/" ("" when unset). */}}
{{- define "cosyvoice-operator.imageRegistry" -}}
{{- trimSuffix "/" (toString (.Values.imageRegistry | default "")) }}
{{- end }}

{{/*
The operator's image: image.repository, moved to imageRegistry when set (what comes before its
last "/" replaced, as the operator moves its builder and serving images: shell/config.py
rebase_image), by digest when image.digest is set, else by tag.
*/}}
{{- define "cosyvoice-operator.image" -}}
{{- $registry := include "cosyvoice-operator.imageRegistry" . }}
{{- $repository := .Values.image.repository }}
{{- if $registry }}
{{- $repository = printf "%s/%s" $registry (last (splitList "/" $repository)) }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{- define "cosyvoice-operator.peeringName" -}}
{{- default (include "cosyvoice-operator.fullname" .) .Values.peering.name }}
{{- end }}

{{/* An environment value as the operator reads it: whole numbers without an exponent. */}}
{{- define "cosyvoice-operator.envValue" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) }}
{{- printf "%d" (int64 .) }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}

{{/*
imagePolicy.allowedPrefixes, checked, as a JSON list (the chart's ValidatingAdmissionPolicy and
the operator's COSYVOICE_ALLOWED_IMAGE_PREFIXES read the same list). A prefix must end in "/",
":" or "@": a bare "ghcr.io/cosy" would also admit "ghcr.io/cosy-evil/...".
*/}}
{{- define "cosyvoice-operator.allowedImagePrefixes" -}}
{{- $prefixes := .Values.imagePolicy.allowedPrefixes | default list }}
{{- if not (kindIs "slice" $prefixes) }}
{{- fail (printf "imagePolicy.allowedPrefixes must be a list of image prefixes, not %s" (toJson $prefixes)) }}
{{- end }}
{{- if not $prefixes }}
{{- fail `imagePolicy.allowedPrefixes is empty: with imagePolicy.enabled=true it must list at least one prefix (e.g. "ghcr.io/cosyvoice-operator/"), or set imagePolicy.enabled=false` }}
{{- end }}
{{- range $prefixes }}
{{- if not (kindIs "string" .) }}
{{- fail (printf "imagePolicy.allowedPrefixes: %s is not a string" (toJson .)) }}
{{- end }}
{{- if eq . "" }}
{{- fail "imagePolicy.allowedPrefixes: an empty prefix would admit every image" }}
{{- end }}
{{- if not (regexMatch "[/:@]$" .) }}
{{- fail (printf `imagePolicy.allowedPrefixes: %s must end in "/", ":" or "@" (a registry or repository path, "repository:" or "repository@"): as it is, it would also admit images such as %s` (toJson .) (toJson (printf "%s-other/image:tag" .))) }}
{{- end }}
{{- if regexMatch "[,[:space:]]" . }}
{{- fail (printf "imagePolicy.allowedPrefixes: %s contains a comma or a space, which no image reference has" (toJson .)) }}
{{- end }}
{{- end }}
{{- toJson $prefixes }}
{{- end }}

{{/*
Rules on namespaced resources: in the ClusterRole when every namespace is served, else in a
Role in each of watchNamespaces. Each rule is what the operator's code (kube.py and its
informers) or kopf calls, no more. The operator observes everything through list+watch
informers, so there is no `get` anywhere, and it reads no Secret at all.
*/}}
{{- define "cosyvoice-operator.namespacedRules" -}}
# The custom resource: listed and watched by the operator's informer, never read by name. The
# object itself is never written (no progress annotations, no finalizer), so deletion never
# waits on the operator.
- apiGroups: ["tts.cosyvoice.dev"]
  resources: ["cosyvoiceservices"]
  verbs: ["list", "watch"]
# The operator writes a service's status through the status subresource only.
- apiGroups: ["tts.cosyvoice.dev"]
  resources: ["cosyvoiceservices/status"]
  verbs: ["patch"]
# Events on services: the operator's own and kopf's, both core/v1, both only created.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Engine-build Jobs: followed by an informer (list+watch), created if absent (a 409 is "already
# there"), and deleted by the operator (by uid) when it is done with them, e.g. with an engine
# it removes.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "create", "delete"]
# Engine records, one ConfigMap per engine: followed by an informer, created once, merge-patched
# as the engine's state changes, and deleted (by uid) with the engine once no service has
# referenced it for config.engineRetentionSeconds. The Triton model repositories, one
# ConfigMap per service and GPU architecture: server-side applied (patch).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# The serving workloads of each service, owned by it (the garbage collector removes them with
# it): server-side applied (patch) only when what the operator renders changed; a Deployment
# of an architecture the service no longer runs on is deleted. The first apply creates the
# object, which the API server authorizes as `create` too (without it: 403 "cannot create
# resource", found by tests/cluster/test_chart.py's install check).
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# The router's objects (spec.routing.mode Router) are deleted (by uid) when a service leaves
# that mode: its Deployment, ConfigMap, headless Service, PodDisruptionBudget, NetworkPolicy.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Each service's NetworkPolicy (server-side applied, created on first apply; owned by the
# service, so the garbage collector removes it with it): only labelled clients and the metrics
# scraper reach Triton (and the router).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "watch", "create", "patch", "delete"]
{{- if .Values.gatewayAPI.enabled }}
# spec.routing.mode GatewayAPI (gatewayAPI.enabled): each service's GRPCRoute and Envoy
# Gateway BackendTrafficPolicy, server-side applied and followed by an informer.
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["grpcroutes"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: ["gateway.envoyproxy.io"]
  resources: ["backendtrafficpolicies"]
  verbs: ["list", "watch", "create", "patch"]
{{- end }}
# Other autoscalers, followed by an informer: one that targets a service or its Deployments
# while the operator's autoscaler runs is reported as ScalingConflict, never fought.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list", "watch"]
# Build and serving pods, followed by an informer: why a build waits, what it said at its end,
# why a serving pod cannot be scheduled. The operator never creates a pod itself (the Job and
# ReplicaSet controllers do).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# The engine-cache and model claims, followed by an informer: their existence and uid.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "watch"]
# No Secret rule: spec.model.credentialsSecret is read by the build pod (secretKeyRef), never
# by the operator.
{{- if and .Values.peering.enabled .Values.watchNamespaces }}
# kopf peering between replicas, one KopfPeering per served namespace (watched, and patched
# with each replica's keep-alive).
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- end }}

{{/* Rules on cluster-scoped resources: always in a ClusterRole. */}}
{{- define "cosyvoice-operator.clusterRules" -}}
# GPU nodes, followed by the operator's informer: the engine plan builds one engine per GPU
# architecture found on the nodes.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
# kopf: follows CRDs being added, changed or removed (it finds resources by API discovery).
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if .Values.watchNamespaces }}
# kopf, serving named namespaces only: follows those namespaces (names only). Serving every
# namespace it never looks at namespaces.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- if and .Values.peering.enabled (not .Values.watchNamespaces) }}
# kopf peering between replicas serving every namespace: one ClusterKopfPeering.
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- end }}

{{/* Whether the operator serves its metrics: asked for, or needed by the ServiceMonitor. */}}
{{- define "cosyvoice-operator.metricsEnabled" -}}
{{- if or .Values.metrics.enabled .Values.monitoring.serviceMonitor.enabled }}true{{ end }}
{{- end }}

{{- define "cosyvoice-operator.metricsServiceName" -}}
{{- printf "%s-metrics" (include "cosyvoice-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of the metrics Service, and what the ServiceMonitor selects it by. */}}
{{- define "cosyvoice-operator.metricsSelectorLabels" -}}
{{ include "cosyvoice-operator.selectorLabels" . }}
app.kubernetes.io/component: operator-metrics
{{- end }}

{{/* `job` of the operator's scrape target (the ServiceMonitor's: the Service's name). */}}
{{- define "cosyvoice-operator.operatorJob" -}}
{{- default (include "cosyvoice-operator.metricsServiceName" .) .Values.monitoring.prometheusRule.operatorJob }}
{{- end }}

{{/*
ServiceMonitor, PodMonitor and PrometheusRule are kinds of the Prometheus Operator's CRDs
(monitoring.coreos.com/v1). Without them the API server would refuse the release with a bare
"no matches for kind": say what to install instead. Called as (list $ "the value that asked").
`helm template` knows no cluster: pass --api-versions monitoring.coreos.com/v1 (or set
monitoring.requireCRDs=false, as `helm lint` has no such flag).
*/}}
{{- define "cosyvoice-operator.requireMonitoringCRDs" -}}
{{- $root := index . 0 }}
{{- if and $root.Values.monitoring.requireCRDs (not ($root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1")) }}
{{- fail (printf "%s=true needs the Prometheus Operator's CRDs (API monitoring.coreos.com/v1: ServiceMonitor, PodMonitor, PrometheusRule), and this cluster does not serve them. Install the Prometheus Operator first (for example the kube-prometheus-stack chart, or only its CRDs: the prometheus-operator-crds chart of prometheus-community), or leave %s off. With helm template, pass --api-versions monitoring.coreos.com/v1." (index . 1) (index . 1)) }}
{{- end }}
{{- end }}
