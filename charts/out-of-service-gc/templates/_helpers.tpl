{{- /* Objects are named <release>-out-of-service-gc, or just <release> when the release name already
contains the chart name (`helm install out-of-service-gc …`), as `helm create` charts do;
fullnameOverride names them outright. */ -}}
{{- define "oos.name" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "out-of-service-gc" .Release.Name -}}
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

{{- define "oos.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "oos.name" .) -}}
{{- else -}}
{{- required "serviceAccount.name: name the existing ServiceAccount the pods run as, or set serviceAccount.create=true" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "oos.image" -}}
{{- .Values.image.repository }}{{ with .Values.image.digest }}@{{ . }}{{ else }}:{{ $.Values.image.tag | default $.Chart.AppVersion }}{{ end -}}
{{- end -}}

{{- /* The pod template's metadata: the chart's labels, podLabels and podAnnotations. */ -}}
{{- define "oos.podMetadata" -}}
labels:
  {{- include "oos.labels" . | nindent 2 }}
  {{- with .Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .Values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- /* What every pod of the chart shares: pull secrets, pod security context, placement. */ -}}
{{- define "oos.podPlacement" -}}
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
{{- define "oos.securityContext" -}}
{{- $defaults := include "oos.defaultSecurityContext" . | fromYaml -}}
{{- toYaml (mustMergeOverwrite $defaults .Values.securityContext) -}}
{{- end -}}

{{- /* Every argument quoted: a value holding ": " or "#" stays one string. */ -}}
{{- define "oos.extraArgs" -}}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{- /* The restricted Pod Security level: non-root, no privilege, RuntimeDefault seccomp. */ -}}
{{- define "oos.defaultSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- /* The replicas' affinity: the user's, or anti-affinity between them as podAntiAffinity says. */ -}}
{{- define "oos.affinity" -}}
{{- if .Values.affinity -}}
{{- toYaml .Values.affinity -}}
{{- else if eq .Values.podAntiAffinity "required" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "oos.selectorLabels" . | nindent 10 }}
{{- else if eq .Values.podAntiAffinity "preferred" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "oos.selectorLabels" . | nindent 12 }}
{{- end -}}
{{- end -}}

{{- define "oos.topologySpread" -}}
{{- if .Values.zoneSpread }}
- maxSkew: 1
  topologyKey: topology.kubernetes.io/zone
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "oos.selectorLabels" . | nindent 6 }}
{{- end }}
{{- with .Values.topologySpreadConstraints }}
{{ toYaml . }}
{{- end }}
{{- end -}}
