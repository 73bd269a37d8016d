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
Role in each of watchNamespaces. Each rule is what the operator's code (kube.py) or kopf calls,
no more: kopf lists, watches and merge-/JSON-patches, never gets, updates or deletes.
*/}}
{{- define "cosyvoice-operator.namespacedRules" -}}
# The custom resource: kopf lists and watches it and patches its progress annotations; the
# operator's resync loop lists it, then reads each one afresh before acting on it. No
# finalizer, so deletion never waits on the operator.
- apiGroups: ["tts.cosyvoice.dev"]
  resources: ["cosyvoiceservices"]
  verbs: ["get", "list", "watch", "patch"]
# Status goes through the status subresource (kopf's handler results, the resync loop).
- apiGroups: ["tts.cosyvoice.dev"]
  resources: ["cosyvoiceservices/status"]
  verbs: ["patch"]
# Events on services: the operator's own and kopf's, both core/v1, both only created.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Engine-build Jobs: listed by engine key and created if absent (a 409 is "already there",
# so no get; finished Jobs go by their TTL, so no delete).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "create"]
# Pods of the latest build Job, listed by job-name: why a build waits, what it said at its end.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
# Engine records: one ConfigMap per engine, read by name and created once, never updated.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create"]
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
# kopf peering between replicas, one KopfPeering per served namespace (watched, and patched
# with each replica's keep-alive).
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- end }}

{{/* Rules on cluster-scoped resources: always in a ClusterRole. */}}
{{- define "cosyvoice-operator.clusterRules" -}}
# GPU nodes: the engine plan builds one engine per GPU architecture found on nodes.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list"]
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
