{{/*
The name of every resource: fullnameOverride; else, installed as the chart itself,
nameOverride or the release name (with the release named `etcd`, manifests/base's `etcd`);
as a subchart, <release>-<nameOverride or the chart's name>, so that it cannot collide with the
parent's own resources, which are named after the same release.
*/}}
{{- define "etcd-steward.name" -}}
{{- $name := default .Release.Name .Values.nameOverride -}}
{{- if .Values.fullnameOverride -}}
{{- $name = .Values.fullnameOverride -}}
{{- else if ne .Template.BasePath (printf "%s/templates" .Chart.Name) -}}
{{- /* A subchart: its parent's resources are named after the release too. */ -}}
{{- $name = printf "%s-%s" .Release.Name (default .Chart.Name .Values.nameOverride) -}}
{{- end -}}
{{- if gt (len $name) 52 -}}
{{- fail (printf "name %q is longer than 52 characters (pod names add -N and the PVC data-)" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/*
Every resource's labels: the selector's, then Helm's own two (never in a selector: they change
with the chart's version). manifests/base has the selector's only; scripts/chart-checks.py
compares the two without Helm's.
*/}}
{{- define "etcd-steward.labels" -}}
{{ include "etcd-steward.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/*
What selects this release's pods (the StatefulSet, the Services, the PodDisruptionBudget, the
anti-affinity and spread, the NetworkPolicy): the chart's name and the release, so a release
beside another etcd (Bitnami's, or a second one of this chart) never selects its pods.
Immutable in a StatefulSet: see docs/chart.md, "Upgrading from chart 0.1".
*/}}
{{- define "etcd-steward.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The control token's Secret: controlToken.existingSecret, else <name>-control-token. */}}
{{- define "etcd-steward.controlTokenSecret" -}}
{{ default (printf "%s-control-token" (include "etcd-steward.name" .)) .Values.controlToken.existingSecret }}
{{- end -}}

{{/* The ServiceAccount the pods run as (empty: the namespace's default). */}}
{{- define "etcd-steward.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{ default (include "etcd-steward.name" .) .Values.serviceAccount.name }}
{{- else -}}
{{ .Values.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{/*
etcd.quotaBackendBytes in MiB, rounded up, and what backups need from it: the drill restores a
snapshot (one database) into the scratch volume and opens it with a throw-away etcd, so the
scratch volume holds 2.5 databases and the sidecar's memory limit is the database plus 512 MiB
(2 GiB: 5120Mi and 2560Mi, as manifests/overlays/backup-*). A JSON object {scratch, memory};
backups.scratch.sizeLimit and backups.sidecarMemoryLimit, when set, win.
*/}}
{{- define "etcd-steward.backupSizing" -}}
{{- $mib := div (add (int64 .Values.etcd.quotaBackendBytes) 1048575) 1048576 -}}
{{- $scratch := default (printf "%dMi" (div (mul $mib 5) 2)) .Values.backups.scratch.sizeLimit -}}
{{- $memory := default (printf "%dMi" (add $mib 512)) .Values.backups.sidecarMemoryLimit -}}
{{- dict "scratch" $scratch "memory" $memory | toJson -}}
{{- end -}}

{{/*
A Kubernetes quantity ("2560Mi", "3Gi", "1.5G", "500m", "4") in its base unit, as a float (bytes,
or cores). Fails naming the value when it is not a quantity.
*/}}
{{- define "etcd-steward.quantity" -}}
{{- $q := toString .q -}}
{{- if not (regexMatch "^[0-9]+([.][0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$" $q) -}}
{{- fail (printf "%s: %q is not a Kubernetes quantity" .what $q) -}}
{{- end -}}
{{- $n := float64 (regexFind "^[0-9]+([.][0-9]+)?" $q) -}}
{{- $unit := regexReplaceAll "^[0-9]+([.][0-9]+)?" $q "" -}}
{{- $f := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- mulf $n (get $f $unit) -}}
{{- end -}}

{{/*
The sidecar's resources: sidecar.resources as given, never replaced. What it leaves out is sized
here: memory 64Mi/256Mi without backups; with backups, the memory request and limit are what the
drill needs (backups.sidecarMemoryLimit, else etcd.quotaBackendBytes + 512Mi: it runs a
throw-away etcd on the restored database), and the ephemeral-storage request is the scratch
volume's size, so that neither the scheduler nor the kubelet under node pressure counts the
drill as the pod's excess. A given value below that need, or a request above its limit, fails
the render naming both.
*/}}
{{- define "etcd-steward.sidecarResources" -}}
{{- $r := deepCopy (default dict .Values.sidecar.resources) -}}
{{- $req := default dict $r.requests -}}
{{- $lim := default dict $r.limits -}}
{{- if .Values.backups.enabled -}}
{{- $sizing := include "etcd-steward.backupSizing" . | fromJson -}}
{{- $need := dict "memory" $sizing.memory "ephemeral-storage" $sizing.scratch -}}
{{- range $k := list "memory" "ephemeral-storage" -}}
{{- if not (hasKey $req $k) }}{{ $_ := set $req $k (get $need $k) }}{{ end -}}
{{- end -}}
{{- if not (hasKey $lim "memory") }}{{ $_ := set $lim "memory" $sizing.memory }}{{ end -}}
{{- $needMem := include "etcd-steward.quantity" (dict "q" $sizing.memory "what" "backups.sidecarMemoryLimit") | float64 -}}
{{- $needDisk := include "etcd-steward.quantity" (dict "q" $sizing.scratch "what" "backups.scratch.sizeLimit") | float64 -}}
{{- range $where, $m := dict "requests" $req "limits" $lim -}}
{{- if hasKey $m "memory" -}}
{{- if lt (include "etcd-steward.quantity" (dict "q" (get $m "memory") "what" (printf "sidecar.resources.%s.memory" $where)) | float64) $needMem -}}
{{- fail (printf "sidecar.resources.%s.memory %v is below what the backup drill needs, %s (backups.sidecarMemoryLimit, else etcd.quotaBackendBytes + 512Mi): the drill would be OOM-killed, or the pod evicted under node pressure while the leader drills; raise it, or leave it out to have the chart size it" $where (get $m "memory") $sizing.memory) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if lt (include "etcd-steward.quantity" (dict "q" (get $req "ephemeral-storage") "what" "sidecar.resources.requests.ephemeral-storage") | float64) $needDisk -}}
{{- fail (printf "sidecar.resources.requests.ephemeral-storage %v is below the drill's scratch volume, %s (backups.scratch.sizeLimit, else 2.5 x etcd.quotaBackendBytes): under node pressure the kubelet would evict the leader mid-drill; raise it, or leave it out" (get $req "ephemeral-storage") $sizing.scratch) -}}
{{- end -}}
{{- else -}}
{{- if not (hasKey $req "memory") }}{{ $_ := set $req "memory" "64Mi" }}{{ end -}}
{{- if not (hasKey $lim "memory") }}{{ $_ := set $lim "memory" "256Mi" }}{{ end -}}
{{- end -}}
{{- include "etcd-steward.requestsWithinLimits" (dict "what" "sidecar.resources" "requests" $req "limits" $lim) -}}
{{- $_ := set $r "requests" $req -}}
{{- $_ := set $r "limits" $lim -}}
{{- toYaml $r -}}
{{- end -}}

{{/* Fails when a request is above its limit (Kubernetes would refuse every pod after the install succeeded). */}}
{{- define "etcd-steward.requestsWithinLimits" -}}
{{- $what := .what -}}
{{- $lim := default dict .limits -}}
{{- range $k, $v := default dict .requests -}}
{{- if hasKey $lim $k -}}
{{- $rq := include "etcd-steward.quantity" (dict "q" $v "what" (printf "%s.requests.%s" $what $k)) | float64 -}}
{{- $lq := include "etcd-steward.quantity" (dict "q" (get $lim $k) "what" (printf "%s.limits.%s" $what $k)) | float64 -}}
{{- if gt $rq $lq -}}
{{- fail (printf "%s.requests.%s %v is above %s.limits.%s %v: Kubernetes refuses such a pod" $what $k $v $what $k (get $lim $k)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The etcd container's resources, checked: requests within limits, and a memory limit above
etcd.quotaBackendBytes (etcd maps the whole database into memory: a limit below the quota
OOM-kills etcd as the database grows toward it).
*/}}
{{- define "etcd-steward.etcdResources" -}}
{{- $r := default dict .Values.etcd.resources -}}
{{- include "etcd-steward.requestsWithinLimits" (dict "what" "etcd.resources" "requests" $r.requests "limits" $r.limits) -}}
{{- with $r.limits }}{{ with .memory -}}
{{- if le (include "etcd-steward.quantity" (dict "q" . "what" "etcd.resources.limits.memory") | float64) (float64 $.Values.etcd.quotaBackendBytes) -}}
{{- fail (printf "etcd.resources.limits.memory %v is not above etcd.quotaBackendBytes %v: etcd maps the whole database into memory, and would be OOM-killed as it grows toward its quota; raise the limit (the default: twice the quota) or lower the quota" . (int64 $.Values.etcd.quotaBackendBytes)) -}}
{{- end -}}
{{- end }}{{ end -}}
{{- toYaml $r -}}
{{- end -}}

{{/* A probe: the endpoint, then the timings of probes.<kind>. */}}
{{- define "etcd-steward.probe" -}}
httpGet:
  path: {{ .path }}
  port: {{ .port }}
{{- range $k, $v := .timings }}
{{- if ne $k "enabled" }}
{{ $k }}: {{ $v }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The etcd release the pods run (x.y.z): etcd.version, else the tag of etcd.image, else the
etcd-steward image's own (its ETCD_VERSION build argument, 3.5.30). The etcd container's probes
depend on it; a release that cannot be read fails the render, naming etcd.version.
*/}}
{{- define "etcd-steward.etcdVersion" -}}
{{- $v := .Values.etcd.version -}}
{{- if and (not $v) .Values.etcd.image -}}
{{- $last := last (splitList "/" (first (splitList "@" .Values.etcd.image))) -}}
{{- if contains ":" $last }}{{ $v = last (splitList ":" $last) }}{{ end -}}
{{- end -}}
{{- if and (not $v) (not .Values.etcd.image) }}{{ $v = "3.5.30" }}{{ end -}}
{{- $v = trimPrefix "v" $v -}}
{{- if not (regexMatch "^[0-9]+[.][0-9]+[.][0-9]+" $v) -}}
{{- fail (printf "etcd.version: the etcd release of etcd.image %q cannot be read from its tag (%q); set etcd.version (e.g. 3.5.25): the etcd container's probes depend on it" .Values.etcd.image $v) -}}
{{- end -}}
{{- regexFind "^[0-9]+[.][0-9]+[.][0-9]+" $v -}}
{{- end -}}

{{/*
A probe of the etcd container that asks etcd itself, on its metrics port, never the sidecar:
/livez (no quorum needed: a serializable read of the local member) on etcd 3.5.11+, 3.4.29+ and
3.6+; on older releases, whose /health fails without a leader even with serializable=true, a
TCP connection to that port (etcd opens it once its database is open). Takes the root context
and the probe's timings.
*/}}
{{- define "etcd-steward.etcdProbe" -}}
{{- if semverCompare ">=3.5.11 || ~3.4.29" (include "etcd-steward.etcdVersion" .root) -}}
httpGet:
  path: /livez
  port: metrics
{{- else -}}
tcpSocket:
  port: metrics
{{- end }}
{{- range $k, $v := .timings }}
{{- if ne $k "enabled" }}
{{ $k }}: {{ $v }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The etcd-steward image: [registry/]repository[:tag][@digest], the registry global.imageRegistry
(a parent chart's), else image.registry; a digest pins it (the tag is then only for people).
*/}}
{{- define "etcd-steward.image" -}}
{{- $registry := default .Values.image.registry ((.Values.global).imageRegistry) -}}
{{- if $registry }}{{ trimSuffix "/" $registry }}/{{ end }}{{ .Values.image.repository }}
{{- with .Values.image.tag }}:{{ . }}{{ end }}
{{- with .Values.image.digest }}@{{ . }}{{ end }}
{{- end -}}

{{/* imagePullSecrets: global.imagePullSecrets (names or {name}) then imagePullSecrets. */}}
{{- define "etcd-steward.imagePullSecrets" -}}
{{- $all := list -}}
{{- range concat (default list ((.Values.global).imagePullSecrets)) (default list .Values.imagePullSecrets) -}}
{{- $all = append $all (ternary (dict "name" .) . (kindIs "string" .)) -}}
{{- end -}}
{{- with $all | uniq }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* The pod's annotations: prometheus.io/* (metrics.scrapeAnnotations), then podAnnotations over them. */}}
{{- define "etcd-steward.podAnnotations" -}}
{{- $a := dict -}}
{{- if .Values.metrics.scrapeAnnotations -}}
{{- $_ := set $a "prometheus.io/scrape" "true" -}}
{{- $_ := set $a "prometheus.io/port" "8080" -}}
{{- $_ := set $a "prometheus.io/path" "/metrics" -}}
{{- end -}}
{{- $a = mergeOverwrite $a (default dict .Values.podAnnotations) -}}
{{- with $a }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{- define "etcd-steward.caSecret" -}}
{{ default (printf "%s-ca" (include "etcd-steward.name" .)) .Values.tls.issued.caSecret }}
{{- end -}}

{{- define "etcd-steward.peerSecret" -}}
{{ default (printf "%s-peer-tls" (include "etcd-steward.name" .)) .Values.tls.peerSecret }}
{{- end -}}

{{- define "etcd-steward.clientSecret" -}}
{{ default (printf "%s-client-tls" (include "etcd-steward.name" .)) .Values.tls.clientSecret }}
{{- end -}}

{{/* backups.interval ("30m") in seconds, for the "backup too old" alert. */}}
{{- define "etcd-steward.backupIntervalSeconds" -}}
{{- $i := .Values.backups.interval -}}
{{- $n := int (trimSuffix "s" (trimSuffix "m" (trimSuffix "h" $i))) -}}
{{- if hasSuffix "h" $i -}}{{ mul $n 3600 }}
{{- else if hasSuffix "m" $i -}}{{ mul $n 60 }}
{{- else -}}{{ $n }}
{{- end -}}
{{- end -}}

{{/*
The EtcdArchiveLagging threshold in seconds: twelve archive intervals, at least a minute (the
alert file's 60 is the default 5s interval's).
*/}}
{{- define "etcd-steward.archiveLagSeconds" -}}
{{- $i := toString .Values.backups.archiveInterval -}}
{{- $n := int (trimSuffix "s" (trimSuffix "m" (trimSuffix "h" $i))) -}}
{{- $s := $n -}}
{{- if hasSuffix "h" $i -}}{{- $s = mul $n 3600 -}}
{{- else if hasSuffix "m" $i -}}{{- $s = mul $n 60 -}}
{{- end -}}
{{- max 60 (mul 12 $s) -}}
{{- end -}}

{{/*
Configuration checks the schema cannot express; each fails the render with what to change.
*/}}
{{- define "etcd-steward.validate" -}}
{{- if gt (int .Values.initialReplicas) (int .Values.replicas) -}}
{{- fail (printf "initialReplicas (%d) exceeds replicas (%d): the pods that form the cluster must all exist; to scale down, see docs/operations/kubernetes.md (Scale down)" (int .Values.initialReplicas) (int .Values.replicas)) -}}
{{- end -}}
{{- if and .Values.tls.issued.enabled (not .Values.tls.enabled) -}}
{{- fail "tls.issued.enabled needs tls.enabled" -}}
{{- end -}}
{{- if and .Values.tls.issued.enabled .Values.tls.certManager.enabled -}}
{{- fail "tls.issued.enabled and tls.certManager.enabled exclude each other: the pods issue their own certificates, or cert-manager does" -}}
{{- end -}}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.enabled) -}}
{{- fail "tls.certManager.enabled needs tls.enabled" -}}
{{- end -}}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.certManager.issuerRef.name) -}}
{{- fail "tls.certManager.issuerRef.name is required: the Issuer or ClusterIssuer that signs the certificates" -}}
{{- end -}}
{{- if and .Values.auth.enabled (not .Values.auth.existingSecret) -}}
{{- fail "auth.existingSecret is required: the Secret holding the password of auth.username" -}}
{{- end -}}
{{- if .Values.backups.enabled -}}
{{- if or (hasPrefix "s3://" .Values.backups.url) (hasPrefix "gs://" .Values.backups.url) (hasPrefix "az://" .Values.backups.url) -}}
{{- /* Object stores: credentials from backups.credentialsSecret, or from the pods' workload identity (serviceAccount.annotations). */ -}}
{{- else if hasPrefix "file://" .Values.backups.url -}}
{{- if not .Values.backups.volume.claimName -}}
{{- fail "backups.volume.claimName is required for a file:// URL: the sidecar's root filesystem is read-only" -}}
{{- end -}}
{{- if not (hasPrefix (printf "file://%s" .Values.backups.volume.mountPath) .Values.backups.url) -}}
{{- fail (printf "backups.url %q is not under backups.volume.mountPath %q" .Values.backups.url .Values.backups.volume.mountPath) -}}
{{- end -}}
{{- else -}}
{{- fail (printf "backups.url %q: want s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, az://CONTAINER/PREFIX or file:///PATH" .Values.backups.url) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled -}}
{{- fail "metrics.serviceMonitor.enabled and metrics.podMonitor.enabled: choose one; both would scrape every pod twice, and every alert would count each member twice" -}}
{{- end -}}
{{- if le (include "etcd-steward.quantity" (dict "q" .Values.storage.size "what" "storage.size") | float64) (float64 .Values.etcd.quotaBackendBytes) -}}
{{- fail (printf "storage.size %v is not above etcd.quotaBackendBytes %v: the data volume must hold the database at its quota, the WAL and snapshots, and the copies set aside beside them" .Values.storage.size (int64 .Values.etcd.quotaBackendBytes)) -}}
{{- end -}}
{{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) .Values.scaleIn.enabled -}}
{{- fail "serviceAccount.name is required with serviceAccount.create false and scaleIn.enabled: the Role is bound to it" -}}
{{- end -}}
{{- $enc := .Values.backups.encryption -}}
{{- if and (or $enc.existingSecret $enc.decryptionKeys) (not .Values.backups.enabled) -}}
{{- fail "backups.encryption needs backups.enabled: its keys encrypt and decrypt the backups" -}}
{{- end -}}
{{- $seen := dict -}}
{{- range (include "etcd-steward.backupKeyFiles" . | fromJsonArray) -}}
{{- if hasKey $seen .path -}}
{{- fail (printf "backups.encryption: key %q of Secret %q is named twice (the encryption key also reads; list older keys once)" .key .secret) -}}
{{- end -}}
{{- $_ := set $seen .path true -}}
{{- end -}}
{{- end -}}

{{/*
The environment both containers share: the pod's identity, the cluster's shape, then TLS and
auth when on. Both containers must derive the same cluster from it.
*/}}
{{- define "etcd-steward.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: POD_UID
  valueFrom:
    fieldRef:
      fieldPath: metadata.uid
- name: ETCD_STEWARD_REPLICAS
  value: {{ .Values.initialReplicas | int | quote }}
{{- if not .Values.events.enabled }}
- name: ETCD_STEWARD_EVENTS
  value: "false"
{{- end }}
- name: ETCD_STEWARD_SERVICE
  value: {{ include "etcd-steward.name" . }}
- name: ETCD_STEWARD_DATA_DIR
  value: /var/lib/etcd
{{- with .Values.recovery.autoRecoverAfter }}
- name: ETCD_STEWARD_AUTO_RECOVER_AFTER
  value: {{ . | quote }}
{{- end }}
{{- if ne (int64 .Values.etcd.quotaBackendBytes) 2147483648 }}
{{- /* What the sidecar measures NOSPACE against: etcd's --quota-backend-bytes (2 GiB is its default). */}}
- name: ETCD_STEWARD_QUOTA_BACKEND_BYTES
  value: {{ int64 .Values.etcd.quotaBackendBytes | quote }}
{{- end }}
{{- if ne .Values.clusterDomain "cluster.local" }}
- name: ETCD_STEWARD_CLUSTER_DOMAIN
  value: {{ .Values.clusterDomain | quote }}
{{- end }}
{{- if and .Values.tls.enabled .Values.tls.issued.enabled }}
{{- $name := include "etcd-steward.name" . }}
- name: ETCD_STEWARD_TLS_ISSUER_DIR
  value: /etc/etcd/tls/ca
- name: ETCD_STEWARD_TLS_ISSUED_DIR
  value: /var/run/etcd-steward/tls
- name: ETCD_STEWARD_TLS_ISSUED_VALIDITY
  value: {{ .Values.tls.issued.validity | quote }}
- name: ETCD_STEWARD_TLS_SAN
  value: "{{ $name }}-client,{{ $name }}-client.{{ .Release.Namespace }},{{ $name }}-client.{{ .Release.Namespace }}.svc,{{ $name }}-client.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}"
{{- else if .Values.tls.enabled }}
- name: ETCD_STEWARD_CLIENT_CERT_FILE
  value: /etc/etcd/tls/client/tls.crt
- name: ETCD_STEWARD_CLIENT_KEY_FILE
  value: /etc/etcd/tls/client/tls.key
- name: ETCD_STEWARD_TRUSTED_CA_FILE
  value: /etc/etcd/tls/client/ca.crt
- name: ETCD_STEWARD_PEER_CERT_FILE
  value: /etc/etcd/tls/peer/tls.crt
- name: ETCD_STEWARD_PEER_KEY_FILE
  value: /etc/etcd/tls/peer/tls.key
- name: ETCD_STEWARD_PEER_TRUSTED_CA_FILE
  value: /etc/etcd/tls/peer/ca.crt
{{- end }}
{{- if .Values.controlToken.enabled }}
# The shared token control requests (recover, restore) carry between the pods' sidecars.
- name: ETCD_STEWARD_CONTROL_TOKEN_FILE
  value: /var/run/etcd-steward/control/token
{{- end }}
{{- if .Values.auth.enabled }}
- name: ETCD_STEWARD_AUTH_USERNAME
  value: {{ .Values.auth.username | quote }}
- name: ETCD_STEWARD_AUTH_PASSWORD_FILE
  value: /etc/etcd/auth/{{ .Values.auth.passwordKey }}
{{- end }}
{{- end -}}

{{/* The secret mounts both containers share (after the data volume). */}}
{{- define "etcd-steward.secretMounts" -}}
{{- if .Values.controlToken.enabled }}
- name: control-token
  mountPath: /var/run/etcd-steward/control
  readOnly: true
{{- end }}
{{- if and .Values.tls.enabled .Values.tls.issued.enabled }}
- name: tls-ca
  mountPath: /etc/etcd/tls/ca
  readOnly: true
- name: issued-tls
  mountPath: /var/run/etcd-steward/tls
{{- else if .Values.tls.enabled }}
- name: client-tls
  mountPath: /etc/etcd/tls/client
  readOnly: true
- name: peer-tls
  mountPath: /etc/etcd/tls/peer
  readOnly: true
{{- end }}
{{- if .Values.auth.enabled }}
- name: auth
  mountPath: /etc/etcd/auth
  readOnly: true
{{- end }}
{{- end -}}

{{- define "etcd-steward.containerSecurityContext" -}}
{{- toYaml .Values.containerSecurityContext -}}
{{- end -}}

{{/*
The backup store, for both containers: the sidecar backs up to it, init restores from it
when every volume is lost (ETCD_STEWARD_RESTORE).
*/}}
{{- define "etcd-steward.backupEnv" -}}
{{- if .Values.backups.enabled }}
{{- $files := include "etcd-steward.backupKeyFiles" . | fromJsonArray }}
{{- $read := list }}
{{- range $files }}
{{- if .write }}
- name: ETCD_STEWARD_BACKUP_ENCRYPTION_KEY_FILE
  value: {{ printf "/etc/etcd-steward/backup-keys/%s" .path | quote }}
{{- else }}
{{- $read = append $read (printf "/etc/etcd-steward/backup-keys/%s" .path) }}
{{- end }}
{{- end }}
{{- with $read }}
- name: ETCD_STEWARD_BACKUP_DECRYPTION_KEY_FILES
  value: {{ join "," . | quote }}
{{- end }}
- name: ETCD_STEWARD_BACKUP_URL
  value: {{ .Values.backups.url | quote }}
- name: ETCD_STEWARD_BACKUP_INTERVAL
  value: {{ .Values.backups.interval | quote }}
- name: ETCD_STEWARD_BACKUP_KEEP
  value: {{ .Values.backups.keep | int | quote }}
- name: ETCD_STEWARD_ARCHIVE_INTERVAL
  value: {{ .Values.backups.archiveInterval | quote }}
- name: ETCD_STEWARD_BACKUP_COMPRESSION
  value: {{ .Values.backups.compression | quote }}
- name: ETCD_STEWARD_RESTORE
  value: {{ .Values.backups.restore | quote }}
{{- if and .Values.backups.credentialsSecret (hasPrefix "s3://" .Values.backups.url) }}
{{- range $key := list "AWS_ACCESS_KEY_ID" "AWS_SECRET_ACCESS_KEY" "AWS_REGION" "AWS_ENDPOINT_URL" }}
- name: {{ $key }}
  valueFrom:
    secretKeyRef:
      name: {{ $.Values.backups.credentialsSecret }}
      key: {{ $key }}
      {{- if or (eq $key "AWS_REGION") (eq $key "AWS_ENDPOINT_URL") }}
      optional: true
      {{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}


{{/*
The backup key files (backups.encryption), as a JSON list of {secret, key, path, write}: the
encryption key first (write), then the older ones. Each is SECRET/KEY under
/etc/etcd-steward/backup-keys, so keys of the same name in different Secrets do not collide.
*/}}
{{- define "etcd-steward.backupKeyFiles" -}}
{{- $enc := .Values.backups.encryption -}}
{{- $files := list -}}
{{- if $enc.existingSecret -}}
{{- $files = append $files (dict "secret" $enc.existingSecret "key" $enc.secretKey "path" (printf "%s/%s" $enc.existingSecret $enc.secretKey) "write" true) -}}
{{- end -}}
{{- range $enc.decryptionKeys -}}
{{- $files = append $files (dict "secret" .secret "key" .key "path" (printf "%s/%s" .secret .key) "write" false) -}}
{{- end -}}
{{- toJson $files -}}
{{- end -}}

{{/* The backup keys' mount, the same in both containers (read-only). */}}
{{- define "etcd-steward.backupKeyMount" -}}
{{- if and .Values.backups.enabled (include "etcd-steward.backupKeyFiles" . | fromJsonArray) }}
# The age keys: the sidecar encrypts and drills, init restores.
- name: backup-keys
  mountPath: /etc/etcd-steward/backup-keys
  readOnly: true
{{- end }}
{{- end -}}

{{/* The backup keys' volume: one projected Secret item per key file. */}}
{{- define "etcd-steward.backupKeyVolume" -}}
{{- $files := include "etcd-steward.backupKeyFiles" . | fromJsonArray -}}
{{- if and .Values.backups.enabled $files }}
- name: backup-keys
  projected:
    defaultMode: 0440
    sources:
      {{- range $files }}
      - secret:
          name: {{ .secret }}
          items:
            - key: {{ .key | quote }}
              path: {{ .path | quote }}
      {{- end }}
{{- end }}
{{- end -}}

{{/*
gs:// and az:// credentials: every key of backups.credentialsSecret as a variable (GOOGLE_*,
AZURE_*, as the object store reads them). s3:// names its AWS_* keys one by one (backupEnv).
*/}}
{{- define "etcd-steward.backupEnvFrom" -}}
{{- if and .Values.backups.enabled .Values.backups.credentialsSecret (not (hasPrefix "s3://" .Values.backups.url)) }}
envFrom:
  - secretRef:
      name: {{ .Values.backups.credentialsSecret }}
{{- end }}
{{- end -}}

{{/* The ports the pods open, by name: what the NetworkPolicy lets in (chart-checks.py compares). */}}
{{- define "etcd-steward.ports" -}}
{{- dict "client" 2379 "peer" 2380 "metrics" (int .Values.etcd.metricsPort) "http" 8080 "peerReport" 8443 | toJson -}}
{{- end -}}
