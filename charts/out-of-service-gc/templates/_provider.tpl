{{/*
The instance provider's volumes and mounts: kind redfish's map (a ConfigMap rendered from
instanceProvider.redfish.machines) and the Secrets it names; kind cluster-api's management
kubeconfig Secret.
*/}}
{{- define "nodegrace.providerVolumeMounts" -}}
{{- $provider := .Values.instanceProvider }}
{{- if eq $provider.kind "redfish" }}
- name: redfish-map
  mountPath: /etc/nodegrace/redfish
  readOnly: true
{{- range $secret := include "nodegrace.redfishSecrets" . | fromJsonArray }}
- name: {{ printf "redfish-%s" $secret | trunc 63 | trimSuffix "-" }}
  mountPath: {{ printf "/etc/nodegrace/redfish-secrets/%s" $secret }}
  readOnly: true
{{- end }}
{{- end }}
{{- if and (eq $provider.kind "cluster-api") (dig "clusterApi" "kubeconfigSecret" "" $provider) }}
- name: cluster-api-kubeconfig
  mountPath: /etc/nodegrace/cluster-api
  readOnly: true
{{- end }}
{{- end }}

{{- define "nodegrace.providerVolumes" -}}
{{- $provider := .Values.instanceProvider }}
{{- if eq $provider.kind "redfish" }}
- name: redfish-map
  configMap:
    name: {{ printf "%s-redfish" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- range $secret := include "nodegrace.redfishSecrets" . | fromJsonArray }}
- name: {{ printf "redfish-%s" $secret | trunc 63 | trimSuffix "-" }}
  secret:
    secretName: {{ $secret }}
{{- end }}
{{- end }}
{{- if and (eq $provider.kind "cluster-api") (dig "clusterApi" "kubeconfigSecret" "" $provider) }}
- name: cluster-api-kubeconfig
  secret:
    secretName: {{ dig "clusterApi" "kubeconfigSecret" "" $provider }}
{{- end }}
{{- end }}

{{/* The Secrets the Redfish map names (credentials and CAs), each once, as a JSON array. */}}
{{- define "nodegrace.redfishSecrets" -}}
{{- $secrets := list }}
{{- range .Values.instanceProvider.redfish.machines }}
{{- $secrets = append $secrets .credentialsSecret }}
{{- with .caSecret }}{{ $secrets = append $secrets . }}{{ end }}
{{- end }}
{{- $secrets | uniq | toJson }}
{{- end }}

{{/* The provider's flags. */}}
{{- define "nodegrace.providerArgs" -}}
{{- $provider := .Values.instanceProvider }}
- {{ printf "--instance-provider=%s" $provider.kind | quote }}
{{- if eq $provider.kind "exec" }}
- {{ printf "--instance-provider-command=%s" $provider.command | quote }}
{{- end }}
{{- if has $provider.kind (list "exec" "aws" "redfish") }}
- {{ printf "--instance-provider-timeout=%s" $provider.timeout | quote }}
{{- end }}
{{- if eq $provider.kind "aws" }}
{{- with $provider.aws.region }}
- {{ printf "--aws-region=%s" . | quote }}
{{- end }}
{{- with $provider.aws.endpointUrl }}
- {{ printf "--aws-endpoint-url=%s" . | quote }}
{{- end }}
{{- with $provider.aws.stsEndpointUrl }}
- {{ printf "--aws-sts-endpoint-url=%s" . | quote }}
{{- end }}
{{- end }}
{{- if eq $provider.kind "redfish" }}
- --redfish-config=/etc/nodegrace/redfish/machines.yaml
{{- end }}
{{- if and (eq $provider.kind "cluster-api") (dig "clusterApi" "kubeconfigSecret" "" $provider) }}
- --cluster-api-kubeconfig=/etc/nodegrace/cluster-api/value
{{- end }}
{{- end }}
