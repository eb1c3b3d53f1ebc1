{{- /* Objects are named <release>-out-of-service-gc, or just <release> when the release name already
contains the chart name (`helm install out-of-service-gc …`), as `helm create` charts do. */ -}}
{{- define "oos.name" -}}
{{- if contains "out-of-service-gc" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-out-of-service-gc" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "oos.labels" -}}
app.kubernetes.io/name: out-of-service-gc
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "oos.selectorLabels" -}}
app.kubernetes.io/name: out-of-service-gc
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
