{{- /* Objects are named <release>-termination-controller, or just <release> when the release name already
contains the chart name (`helm install termination-controller …`), as `helm create` charts do;
fullnameOverride names them outright. */ -}}
{{- define "tc.name" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "termination-controller" .Release.Name -}}
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

{{- define "tc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "tc.name" .) -}}
{{- else -}}
{{- required "serviceAccount.name: name the existing ServiceAccount the pods run as, or set serviceAccount.create=true" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tc.image" -}}
{{- .Values.image.repository }}{{ with .Values.image.digest }}@{{ . }}{{ else }}:{{ $.Values.image.tag | default $.Chart.AppVersion }}{{ end -}}
{{- end -}}

{{- /* The pod template's metadata: the chart's labels, podLabels and podAnnotations. */ -}}
{{- define "tc.podMetadata" -}}
labels:
  {{- include "tc.labels" . | nindent 2 }}
  {{- with .Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .Values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- /* What every pod of the chart shares: pull secrets, pod security context, placement. */ -}}
{{- define "tc.podPlacement" -}}
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
{{- define "tc.securityContext" -}}
{{- $defaults := include "tc.defaultSecurityContext" . | fromYaml -}}
{{- toYaml (mustMergeOverwrite $defaults .Values.securityContext) -}}
{{- end -}}

{{- /* Every argument quoted: a value holding ": " or "#" stays one string. */ -}}
{{- define "tc.extraArgs" -}}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{- /* The webhook's Service and the Secret of its serving certificate. */ -}}
{{- define "tc.webhookService" -}}
{{- printf "%s-webhook" (include "tc.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tc.webhookSecret" -}}
{{- printf "%s-webhook-tls" (include "tc.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* The restricted Pod Security level: non-root, no privilege, RuntimeDefault seccomp. */ -}}
{{- define "tc.defaultSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- /* managedNodes (a LabelSelector) in kubectl's -l syntax, for --node-selector. */ -}}
{{- define "tc.managedNodesFlag" -}}
{{- $terms := list -}}
{{- range $key, $value := .Values.managedNodes.matchLabels -}}
{{- $terms = append $terms (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- range .Values.managedNodes.matchExpressions -}}
{{- if eq .operator "In" -}}
{{- $terms = append $terms (printf "%s in (%s)" .key (join "," .values)) -}}
{{- else if eq .operator "NotIn" -}}
{{- $terms = append $terms (printf "%s notin (%s)" .key (join "," .values)) -}}
{{- else if eq .operator "Exists" -}}
{{- $terms = append $terms .key -}}
{{- else -}}
{{- $terms = append $terms (printf "!%s" .key) -}}
{{- end -}}
{{- end -}}
{{- join "," $terms -}}
{{- end -}}

{{- /* The replicas' affinity: the user's, or anti-affinity between them as podAntiAffinity says. */ -}}
{{- define "tc.affinity" -}}
{{- if .Values.affinity -}}
{{- toYaml .Values.affinity -}}
{{- else if eq .Values.podAntiAffinity "required" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "tc.selectorLabels" . | nindent 10 }}
{{- else if eq .Values.podAntiAffinity "preferred" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "tc.selectorLabels" . | nindent 12 }}
{{- end -}}
{{- end -}}

{{- define "tc.topologySpread" -}}
{{- if .Values.zoneSpread }}
- maxSkew: 1
  topologyKey: topology.kubernetes.io/zone
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "tc.selectorLabels" . | nindent 6 }}
{{- end }}
{{- with .Values.topologySpreadConstraints }}
{{ toYaml . }}
{{- end }}
{{- end -}}
