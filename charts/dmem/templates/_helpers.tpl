{{/* Chart name. */}}
{{- define "dmem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: release-chart, unless the release name already contains the chart name. */}}
{{- define "dmem.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of a role's resources: <fullname>-<role>. Call with (dict "root" $ "role" "write"). */}}
{{- define "dmem.roleName" -}}
{{- printf "%s-%s" (include "dmem.fullname" .root | trunc 55 | trimSuffix "-") .role -}}
{{- end -}}

{{- define "dmem.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dmem.labels" -}}
helm.sh/chart: {{ include "dmem.chart" . }}
{{ include "dmem.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dmem
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "dmem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dmem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of one role. Call with (dict "root" $ "role" "write"). */}}
{{- define "dmem.roleLabels" -}}
{{ include "dmem.labels" .root }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "dmem.roleSelectorLabels" -}}
{{ include "dmem.selectorLabels" .root }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "dmem.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "dmem.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dmem.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* True when SASL is configured. */}}
{{- define "dmem.kafkaSasl" -}}
{{- if .Values.externalKafka.sasl.mechanism -}}true{{- end -}}
{{- end -}}

{{/* Secret holding the Kafka SASL credentials: the existing one or the chart's. */}}
{{- define "dmem.kafkaSecretName" -}}
{{- default (printf "%s-credentials" (include "dmem.fullname" .)) .Values.externalKafka.sasl.existingSecret -}}
{{- end -}}

{{- define "dmem.milvusSecretName" -}}
{{- default (printf "%s-credentials" (include "dmem.fullname" .)) .Values.externalMilvus.existingSecret -}}
{{- end -}}

{{/* True when the chart must create its own credentials Secret. */}}
{{- define "dmem.createSecret" -}}
{{- $k := and (include "dmem.kafkaSasl" .) (not .Values.externalKafka.sasl.existingSecret) -}}
{{- $m := and .Values.externalMilvus.token (not .Values.externalMilvus.existingSecret) -}}
{{- if or $k $m -}}true{{- end -}}
{{- end -}}

{{/* True when the Milvus token comes from a Secret. */}}
{{- define "dmem.milvusToken" -}}
{{- if or .Values.externalMilvus.existingSecret .Values.externalMilvus.token -}}true{{- end -}}
{{- end -}}

{{/* Roles enabled, in a fixed order. */}}
{{- define "dmem.roles" -}}
{{- $out := list -}}
{{- range $r := list "write" "respond" "jobs" "all" -}}
{{- if (index $.Values.roles $r).enabled -}}{{- $out = append $out $r -}}{{- end -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* True when a role serving the HTTP API (/v1/*: respond, all) is enabled. */}}
{{- define "dmem.httpApi" -}}
{{- if or .Values.roles.respond.enabled .Values.roles.all.enabled -}}true{{- end -}}
{{- end -}}

{{/* True when the pods mount a tokens Secret (existing or the chart's). */}}
{{- define "dmem.authTokens" -}}
{{- if and .Values.auth.enabled (or .Values.auth.existingSecret .Values.auth.tokens) -}}true{{- end -}}
{{- end -}}

{{/* True when the chart must create the Secret holding the inline auth.tokens. */}}
{{- define "dmem.createAuthSecret" -}}
{{- if and (include "dmem.authTokens" .) (include "dmem.httpApi" .) (not .Values.auth.existingSecret) -}}true{{- end -}}
{{- end -}}

{{- define "dmem.authSecretName" -}}
{{- default (printf "%s-auth" (include "dmem.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{/* Key of the tokens file in the auth Secret: existingSecretKey, or the chart's fixed key. */}}
{{- define "dmem.authSecretKey" -}}
{{- if .Values.auth.existingSecret -}}{{ .Values.auth.existingSecretKey }}{{- else -}}tokens.json{{- end -}}
{{- end -}}
