{{/* Names, labels and small computed values shared by every template. */}}

{{/* The chart name, or nameOverride. */}}
{{- define "gputask.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release-qualified name, or fullnameOverride; the release name alone when it already contains the chart name. */}}
{{- define "gputask.fullname" -}}
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

{{/* Labels on every object. */}}
{{- define "gputask.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "gputask.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gputask
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component; call with (dict "root" $ "component" "operator"). */}}
{{- define "gputask.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gputask.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* All labels of one component's objects; same argument as gputask.selectorLabels. */}}
{{- define "gputask.componentLabels" -}}
{{ include "gputask.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The image reference: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "gputask.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "gputask.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (printf "%s-operator" (include "gputask.fullname" .)) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The agent's ServiceAccount name. */}}
{{- define "gputask.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (printf "%s-agent" (include "gputask.fullname" .)) .Values.agent.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The leader-election Lease's name: config.leaseName, else <fullname>-operator. */}}
{{- define "gputask.leaseName" -}}
{{- default (printf "%s-operator" (include "gputask.fullname" .)) .Values.config.leaseName }}
{{- end }}

{{/* The leader-election Lease's namespace: config.leaseNamespace, else the release namespace (the operator's POD_NAMESPACE). */}}
{{- define "gputask.leaseNamespace" -}}
{{- default .Release.Namespace .Values.config.leaseNamespace }}
{{- end }}

{{/* The versioned configuration file the operator reads with --config. */}}
{{- define "gputask.configFile" -}}
{{- $c := .Values.config -}}
apiVersion: gputask.io/v1alpha1
kind: Configuration
nodeFailureGracePeriod: {{ toYaml $c.nodeFailureGracePeriod }}
heartbeatStaleAfter: {{ toYaml $c.heartbeatStaleAfter }}
cycleInterval: {{ toYaml $c.cycleInterval }}
policy: {{ toYaml $c.policy }}
queueing: {{ toYaml $c.queueing }}
pinning: {{ toYaml $c.pinning }}
jobRuntimeClassName: {{ toYaml $c.jobRuntimeClassName }}
namespace: {{ toYaml $c.namespace }}
foreignMemoryToleranceMiB: {{ toYaml $c.foreignMemoryToleranceMiB }}
leaderElection: {{ toYaml $c.leaderElection }}
leaseName: {{ include "gputask.leaseName" . }}
leaseNamespace: {{ include "gputask.leaseNamespace" . }}
leaseDuration: {{ toYaml $c.leaseDuration }}
leaseRenewDeadline: {{ toYaml $c.leaseRenewDeadline }}
leaseRenewInterval: {{ toYaml $c.leaseRenewInterval }}
podStartTimeout: {{ toYaml $c.podStartTimeout }}
apiConcurrency: {{ toYaml $c.apiConcurrency }}
queuePositionsTracked: {{ toYaml $c.queuePositionsTracked }}
fairSharing:
  preemptionStrategies: {{ toJson $c.fairSharing.preemptionStrategies }}
memoryBudget:
  action: {{ toYaml $c.memoryBudget.action }}
  toleranceMiB: {{ toYaml $c.memoryBudget.toleranceMiB }}
defragmentation:
  mode: {{ toYaml $c.defragmentation.mode }}
  minRuntime: {{ toYaml $c.defragmentation.minRuntime }}
  maxMovesPerWindow: {{ toYaml $c.defragmentation.maxMovesPerWindow }}
  window: {{ toYaml $c.defragmentation.window }}
  priorityThreshold: {{ toYaml $c.defragmentation.priorityThreshold }}
  maxMovesPerQueue: {{ toYaml $c.defragmentation.maxMovesPerQueue }}
  schedule: {{ $c.defragmentation.schedule | quote }}
userJobs:
  excludeNamespaces: {{ toJson $c.userJobs.excludeNamespaces }}
{{- end }}
