{{/* Names: the release name when it already says koord-recommender, else <release>-koord-recommender. */}}
{{- define "kr.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kr.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: koord-recommender
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: call with (dict "root" $ "component" "serve"). */}}
{{- define "kr.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The image of a role: call with (dict "root" $ "role" "serve"). */}}
{{- define "kr.image" -}}
{{- $image := index .root.Values.images .role -}}
{{- printf "%s:%s" $image.repository (default (printf "%s-%s" .root.Chart.AppVersion .role) $image.tag) -}}
{{- end -}}

{{- define "kr.tlsSecret" -}}
{{- default (printf "%s-tls" (include "kr.fullname" .)) .Values.tls.secretName -}}
{{- end -}}

{{- define "kr.storeClaim" -}}
{{- default (printf "%s-store" (include "kr.fullname" .)) .Values.store.pvc.existingClaim -}}
{{- end -}}

{{/* True when the store is a single-node volume, so its pods must share the serve pods' node. */}}
{{- define "kr.storeOnOneNode" -}}
{{- if and (not .Values.store.url) (eq .Values.store.pvc.accessMode "ReadWriteOnce") -}}true{{- end -}}
{{- end -}}

{{- define "kr.storePath" -}}
{{- .Values.store.url | default "/var/lib/koord-recommender/store" -}}
{{- end -}}

{{/* Container env of every role: the store's credentials and the extra settings of the component. */}}
{{- define "kr.env" -}}
- name: MPLCONFIGDIR
  value: /tmp/matplotlib
{{- range $name, $value := .env }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{- define "kr.envFrom" -}}
{{- if and .Values.store.url .Values.store.credentialsSecret }}
envFrom:
  - secretRef:
      name: {{ .Values.store.credentialsSecret }}
{{- end }}
{{- end -}}

{{/* The store's volume mount: call with (dict "root" $ "readOnly" true). */}}
{{- define "kr.storeMount" -}}
{{- if not .root.Values.store.url }}
- name: store
  mountPath: /var/lib/koord-recommender/store
  {{- if .readOnly }}
  readOnly: true
  {{- end }}
{{- end }}
{{- end -}}

{{- define "kr.storeVolume" -}}
{{- if not .Values.store.url }}
- name: store
  persistentVolumeClaim:
    claimName: {{ include "kr.storeClaim" . }}
{{- end }}
{{- end -}}

{{/* With a ReadWriteOnce store, every pod that mounts it runs on the serve pods' node (the first serve pod
     matches its own term, so it may go anywhere). */}}
{{- define "kr.affinity" -}}
{{- if .affinity }}
affinity:
  {{- toYaml .affinity | nindent 2 }}
{{- else if include "kr.storeOnOneNode" .root }}
affinity:
  podAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "kr.selector" (dict "root" .root "component" "serve") | nindent 12 }}
{{- end }}
{{- end -}}

{{- define "kr.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end -}}

{{- define "kr.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The training pod, shared by the CronJob and the first run. */}}
{{- define "kr.trainPod" -}}
metadata:
  labels:
    {{- include "kr.selector" (dict "root" . "component" "train") | nindent 4 }}
spec:
  serviceAccountName: {{ include "kr.fullname" . }}-train
  automountServiceAccountToken: false
  restartPolicy: Never
  {{- with include "kr.pullSecrets" . | trim }}{{ . | nindent 2 }}{{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  {{- with include "kr.affinity" (dict "root" . "affinity" dict) | trim }}{{ . | nindent 2 }}{{- end }}
  containers:
    - name: train
      image: {{ include "kr.image" (dict "root" . "role" "train") }}
      imagePullPolicy: {{ .Values.images.pullPolicy }}
      args:
        - train
        - --prometheus-url={{ required "prometheus.url is required: the Prometheus-compatible query endpoint training reads (e.g. http://prometheus-operated.monitoring.svc:9090)" .Values.prometheus.url }}
        - --store={{ include "kr.storePath" . }}
        - --history={{ .Values.prometheus.history }}
        {{- if .Values.train.incremental }}
        - --incremental
        {{- end }}
        {{- with .Values.prometheus.bearerToken.secretName }}
        - --bearer-token-file=/etc/koord-recommender/prometheus/token/token
        {{- end }}
        {{- if or .Values.prometheus.ca.configMapName .Values.prometheus.ca.secretName }}
        - --ca-file=/etc/koord-recommender/prometheus/ca/ca.crt
        {{- end }}
        {{- range .Values.train.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      env:
        {{- include "kr.env" (dict "env" .Values.train.env) | nindent 8 }}
        {{- with include "kr.prometheusEnv" . | trim }}{{ . | nindent 8 }}{{- end }}
      {{- with include "kr.envFrom" . | trim }}{{ . | nindent 6 }}{{- end }}
      resources:
        {{- toYaml .Values.train.resources | nindent 8 }}
      {{- include "kr.containerSecurity" . | nindent 6 }}
      volumeMounts:
        {{- with include "kr.storeMount" (dict "root" . "readOnly" false) | trim }}{{ . | nindent 8 }}{{- end }}
        - name: tmp
          mountPath: /tmp
        {{- with include "kr.prometheusMounts" . | trim }}{{ . | nindent 8 }}{{- end }}
  volumes:
    {{- with include "kr.storeVolume" . | trim }}{{ . | nindent 4 }}{{- end }}
    - name: tmp
      emptyDir:
        sizeLimit: 256Mi
    {{- with include "kr.prometheusVolumes" . | trim }}{{ . | nindent 4 }}{{- end }}
{{- end -}}

{{/* How the Prometheus readers (training, the live loop) reach Prometheus: settings, then their secrets' files. */}}
{{- define "kr.prometheusEnv" -}}
{{- with .Values.prometheus.headers }}
- name: KOORD_RECOMMENDER_PROMETHEUS__HEADERS
  value: {{ toJson . | quote }}
{{- end }}
{{- with .Values.prometheus.extraLabels }}
- name: KOORD_RECOMMENDER_PROMETHEUS__EXTRA_LABELS
  value: {{ toJson . | quote }}
{{- end }}
{{- with .Values.prometheus.basicAuth.secretName }}
- name: KOORD_RECOMMENDER_PROMETHEUS__BASIC_AUTH_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: username
- name: KOORD_RECOMMENDER_PROMETHEUS__BASIC_AUTH_PASSWORD_FILE
  value: /etc/koord-recommender/prometheus/basic-auth/password
{{- end }}
{{- end -}}

{{- define "kr.prometheusMounts" -}}
{{- if .Values.prometheus.bearerToken.secretName }}
- name: prometheus-token
  mountPath: /etc/koord-recommender/prometheus/token
  readOnly: true
{{- end }}
{{- if .Values.prometheus.basicAuth.secretName }}
- name: prometheus-basic-auth
  mountPath: /etc/koord-recommender/prometheus/basic-auth
  readOnly: true
{{- end }}
{{- if or .Values.prometheus.ca.configMapName .Values.prometheus.ca.secretName }}
- name: prometheus-ca
  mountPath: /etc/koord-recommender/prometheus/ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "kr.prometheusVolumes" -}}
{{- with .Values.prometheus.bearerToken.secretName }}
- name: prometheus-token
  secret:
    secretName: {{ . }}
    items: [{key: {{ $.Values.prometheus.bearerToken.key }}, path: token}]
{{- end }}
{{- with .Values.prometheus.basicAuth.secretName }}
- name: prometheus-basic-auth
  secret:
    secretName: {{ . }}
    items: [{key: password, path: password}]
{{- end }}
{{- if .Values.prometheus.ca.configMapName }}
- name: prometheus-ca
  configMap:
    name: {{ .Values.prometheus.ca.configMapName }}
    items: [{key: {{ .Values.prometheus.ca.key }}, path: ca.crt}]
{{- else if .Values.prometheus.ca.secretName }}
- name: prometheus-ca
  secret:
    secretName: {{ .Values.prometheus.ca.secretName }}
    items: [{key: {{ .Values.prometheus.ca.key }}, path: ca.crt}]
{{- end }}
{{- end -}}

{{/* The non-resource URL whose `get` the reader ClusterRole grants and serve checks by SubjectAccessReview: one per
release, so a reader of one release reads no other. */}}
{{- define "kr.readerPath" -}}
{{- printf "/koord-recommender.io/%s/%s" .Release.Namespace (include "kr.fullname" .) -}}
{{- end -}}

{{/* True when the chart's ServiceMonitor scrapes with the token of an account of its own (no token Secret given). */}}
{{- define "kr.metricsAccount" -}}
{{- if and .Values.serviceMonitor.enabled (not .Values.serviceMonitor.bearerTokenSecret.name) -}}true{{- end -}}
{{- end -}}

{{- define "kr.clientCA" -}}
{{- if or .Values.auth.clientCA.secretName .Values.auth.clientCA.configMapName -}}true{{- end -}}
{{- end -}}
