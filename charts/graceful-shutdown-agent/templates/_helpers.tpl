{{- /* Objects are named <release>-graceful-shutdown-agent, or just <release> when the release name already
contains the chart name (`helm install graceful-shutdown-agent …`), as `helm create` charts do. */ -}}
{{- define "gsa.name" -}}
{{- if contains "graceful-shutdown-agent" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-graceful-shutdown-agent" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gsa.labels" -}}
app.kubernetes.io/name: graceful-shutdown-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.extraLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gsa.selectorLabels" -}}
app.kubernetes.io/name: graceful-shutdown-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
