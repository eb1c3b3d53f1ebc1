{{- /* Objects are named <release>-termination-controller, or just <release> when the release name already
contains the chart name (`helm install termination-controller …`), as `helm create` charts do. */ -}}
{{- define "tc.name" -}}
{{- if contains "termination-controller" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-termination-controller" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tc.labels" -}}
app.kubernetes.io/name: termination-controller
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tc.selectorLabels" -}}
app.kubernetes.io/name: termination-controller
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- /* The webhook's Service and the Secret of its serving certificate. */ -}}
{{- define "tc.webhookService" -}}
{{- printf "%s-webhook" (include "tc.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tc.webhookSecret" -}}
{{- printf "%s-webhook-tls" (include "tc.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
