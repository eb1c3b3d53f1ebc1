{{- /* Objects are named <release>-shutdown-inhibitor-agent, or just <release> when the release name already
contains the chart name (`helm install shutdown-inhibitor-agent …`), as `helm create` charts do;
fullnameOverride names them outright. */ -}}
{{- define "sia.name" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "shutdown-inhibitor-agent" .Release.Name -}}
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

{{- define "sia.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "sia.name" .) -}}
{{- else -}}
{{- required "serviceAccount.name: name the existing ServiceAccount the pods run as, or set serviceAccount.create=true" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sia.image" -}}
{{- .Values.image.repository }}{{ with .Values.image.digest }}@{{ . }}{{ else }}:{{ $.Values.image.tag | default $.Chart.AppVersion }}{{ end -}}
{{- end -}}

{{- /* The pod template's metadata: the chart's labels, podLabels and podAnnotations. */ -}}
{{- define "sia.podMetadata" -}}
labels:
  {{- include "sia.labels" . | nindent 2 }}
  {{- with .Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .Values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- /* What every pod of the chart shares: pull secrets, pod security context, placement. */ -}}
{{- define "sia.podPlacement" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- /* The container's securityContext: the chart's defaults with securityContext merged over. */ -}}
{{- define "sia.securityContext" -}}
{{- $defaults := include "sia.defaultSecurityContext" . | fromYaml -}}
{{- toYaml (mustMergeOverwrite $defaults .Values.securityContext) -}}
{{- end -}}

{{- /* Every argument quoted: a value holding ": " or "#" stays one string. */ -}}
{{- define "sia.extraArgs" -}}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{- /* Not the restricted Pod Security level: the agent talks to the host's logind over its
D-Bus socket (a hostPath), as root: logind accepts block inhibitors from root callers only when no polkit is consulted; running as root keeps the Inhibit call working on every distribution. */ -}}
{{- define "sia.defaultSecurityContext" -}}
runAsUser: 0
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
seccompProfile:
  type: RuntimeDefault
capabilities:
  drop: [ALL]
{{- end -}}
