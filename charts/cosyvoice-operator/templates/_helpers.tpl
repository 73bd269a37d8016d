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
Rules on namespaced resources: in the ClusterRole when every namespace is served, else in a
Role in each of watchNamespaces. Each rule is what the operator's code (or kopf) calls, no more.
*/}}
{{- define "cosyvoice-operator.namespacedRules" -}}
# The custom resource: kopf lists and watches it, patches finalizers and its progress
# annotations (patch), and writes status through the status subresource.
- apiGroups: ["tts.cosyvoice.dev"]
  resources: ["cosyvoiceservices"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["tts.cosyvoice.dev"]
  resources: ["cosyvoiceservices/status", "cosyvoiceservices/scale"]
  verbs: ["patch"]
# Events on services (kopf.info / kopf.warn and kopf's own handler events).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# Engine-build Jobs (create-if-absent, list by engine key) and their pods (why a build waits
# or what it said when it ended).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# Engine records: one ConfigMap per built engine, created once, never updated.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create"]
# The engine-cache and model claims are only checked for existence.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get"]
# spec.model.credentialsSecret is only checked for existence (the build pod reads it through
# envFrom). RBAC has no existence-only verb: `get` does return the Secret's data, so this is
# the one grant wider than what the operator uses. No list/watch: no Secret can be enumerated.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- if and .Values.peering.enabled .Values.watchNamespaces }}
# kopf peering between replicas, one KopfPeering per served namespace.
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}

{{/* Rules on cluster-scoped resources: always in a ClusterRole. */}}
{{- define "cosyvoice-operator.clusterRules" -}}
# GPU nodes: the engine plan builds one engine per GPU architecture found on nodes.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
# kopf: finds its resources from the CRDs and follows them being added or removed.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
# kopf: lists and watches namespaces to match the served ones (namespace names only).
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- if and .Values.peering.enabled (not .Values.watchNamespaces) }}
# kopf peering between replicas serving every namespace: one ClusterKopfPeering.
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}
