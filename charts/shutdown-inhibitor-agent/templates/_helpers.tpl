{{- /* Objects are named <release>-shutdown-inhibitor-agent, or just <release> when the release name already
contains the chart name (`helm install shutdown-inhibitor-agent …`), as `helm create` charts do. */ -}}
{{- define "sia.name" -}}
{{- if contains "shutdown-inhibitor-agent" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-shutdown-inhibitor-agent" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sia.labels" -}}
app.kubernetes.io/name: shutdown-inhibitor-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sia.selectorLabels" -}}
app.kubernetes.io/name: shutdown-inhibitor-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
