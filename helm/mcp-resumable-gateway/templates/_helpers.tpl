{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "mcpgw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release name, plus the chart name unless it already contains it. */}}
{{- define "mcpgw.fullname" -}}
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

{{- define "mcpgw.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "mcpgw.labels" -}}
helm.sh/chart: {{ include "mcpgw.chart" . }}
{{ include "mcpgw.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "mcpgw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mcpgw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "mcpgw.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mcpgw.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is pinned. */}}
{{- define "mcpgw.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Secret entries (env name -> key) the gateway reads: REDIS_URL, REDIS_PASSWORD. */}}
{{- define "mcpgw.redisSecretKeys" -}}
{{- $keys := dict }}
{{- if .Values.redis.existingSecret }}
{{- if .Values.redis.existingSecretKey }}{{ $_ := set $keys "REDIS_URL" .Values.redis.existingSecretKey }}{{ end }}
{{- if .Values.redis.existingSecretPasswordKey }}{{ $_ := set $keys "REDIS_PASSWORD" .Values.redis.existingSecretPasswordKey }}{{ end }}
{{- else }}
{{- if .Values.redis.url }}{{ $_ := set $keys "REDIS_URL" "REDIS_URL" }}{{ end }}
{{- if .Values.redis.password }}{{ $_ := set $keys "REDIS_PASSWORD" "REDIS_PASSWORD" }}{{ end }}
{{- end }}
{{- toJson $keys }}
{{- end }}

{{/* The Secret the Redis credentials come from. */}}
{{- define "mcpgw.redisSecretName" -}}
{{- default (include "mcpgw.fullname" .) .Values.redis.existingSecret }}
{{- end }}

{{/* "true" when the gateway gets a Redis store (URL, Cluster or Sentinel); empty otherwise. */}}
{{- define "mcpgw.usesRedis" -}}
{{- $keys := include "mcpgw.redisSecretKeys" . | fromJson }}
{{- if or (hasKey $keys "REDIS_URL") .Values.config.REDIS_CLUSTER_NODES .Values.config.REDIS_SENTINELS }}true{{ end }}
{{- end }}

{{/*
A value of .Values.config as an env string. Helm reads YAML numbers as float64,
which print as 1.6777216e+07: integers are converted before quoting.
*/}}
{{- define "mcpgw.envValue" -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) }}
{{- . | int64 | toString | quote }}
{{- else }}
{{- . | toString | quote }}
{{- end }}
{{- end }}

{{/* UPSTREAM_URL: the upstream headless Service's name when given (each ready pod an endpoint), else config.UPSTREAM_URL. */}}
{{- define "mcpgw.upstreamUrl" -}}
{{- $svc := .Values.upstream.headlessService }}
{{- if $svc.name }}
{{- printf "%s://%s.%s.svc.%s:%d%s" $svc.scheme $svc.name (default .Release.Namespace $svc.namespace) $svc.clusterDomain (int $svc.port) $svc.path }}
{{- else }}
{{- .Values.config.UPSTREAM_URL }}
{{- end }}
{{- end }}

{{/* Seconds the gateway may take after SHUTDOWN_GRACE_SECONDS before its hard stop (closeWithGrace delay in src/main.ts). */}}
{{- define "mcpgw.stopMarginSeconds" -}}
2
{{- end }}

{{/* Settings that cannot work together fail the release instead of failing at runtime. */}}
{{- define "mcpgw.validate" -}}
{{- $replicated := or (gt (int .Values.replicaCount) 1) .Values.autoscaling.enabled }}
{{- if and $replicated (not (include "mcpgw.usesRedis" .)) }}
{{- fail "replicaCount > 1 or autoscaling.enabled needs Redis: set redis.url (or redis.existingSecret), config.REDIS_CLUSTER_NODES or config.REDIS_SENTINELS (the embedded store is per process, so a client resuming on another replica would find nothing)" }}
{{- end }}
{{- /* The gateway's hard stop comes graceSeconds + 2 s after SIGTERM (src/main.ts). */}}
{{- $stop := add .Values.shutdown.preStopSleepSeconds .Values.shutdown.graceSeconds (include "mcpgw.stopMarginSeconds" .) }}
{{- if le (int .Values.shutdown.terminationGracePeriodSeconds) (int $stop) }}
{{- fail (printf "shutdown.terminationGracePeriodSeconds (%d) must exceed shutdown.preStopSleepSeconds + shutdown.graceSeconds + %s s, the gateway's own stop margin (%d), or the kubelet kills the gateway mid-drain" (int .Values.shutdown.terminationGracePeriodSeconds) (include "mcpgw.stopMarginSeconds" .) (int $stop)) }}
{{- end }}
{{- end }}
