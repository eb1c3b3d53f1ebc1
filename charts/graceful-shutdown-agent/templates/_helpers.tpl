{{- /* Objects are named <release>-graceful-shutdown-agent, or just <release> when the release name already
contains the chart name (`helm install graceful-shutdown-agent …`), as `helm create` charts do;
fullnameOverride names them outright. */ -}}
{{- define "gsa.name" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "graceful-shutdown-agent" .Release.Name -}}
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

{{- define "gsa.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "gsa.name" .) -}}
{{- else -}}
{{- required "serviceAccount.name: name the existing ServiceAccount the pods run as, or set serviceAccount.create=true" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gsa.image" -}}
{{- .Values.image.repository }}{{ with .Values.image.digest }}@{{ . }}{{ else }}:{{ $.Values.image.tag | default $.Chart.AppVersion }}{{ end -}}
{{- end -}}

{{- /* The pod template's metadata: the chart's labels, podLabels and podAnnotations. */ -}}
{{- define "gsa.podMetadata" -}}
labels:
  {{- include "gsa.labels" . | nindent 2 }}
  {{- with .Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .Values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- /* What every pod of the chart shares: pull secrets, pod security context, placement. */ -}}
{{- define "gsa.podPlacement" -}}
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
{{- define "gsa.securityContext" -}}
{{- $defaults := include "gsa.defaultSecurityContext" . | fromYaml -}}
{{- toYaml (mustMergeOverwrite $defaults .Values.securityContext) -}}
{{- end -}}

{{- /* Every argument quoted: a value holding ": " or "#" stays one string. */ -}}
{{- define "gsa.extraArgs" -}}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{- /* Not the restricted Pod Security level: the agent talks to the host's logind over its
D-Bus socket (a hostPath), as root: logind's drop-in directory and the shutdown record are root's on the host. */ -}}
{{- define "gsa.defaultSecurityContext" -}}
runAsUser: 0
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
seccompProfile:
  type: RuntimeDefault
capabilities:
  drop: [ALL]
  # logind's PID (from the bus) is a host PID; reloading logind means signalling it.
  add: [KILL]
{{- end -}}
