#!/usr/bin/env bash
# Builds the project's test API server (tests/kube-apiserver/, Kubernetes' own API server
# libraries: k8s.io/apiserver's generic server, etcd3 storage and watch cache, and the
# apiextensions server) from Debian's unstable suite, where they are packaged as Go source:
#   golang-k8s-apiserver-dev, golang-k8s-apiextensions-apiserver-dev, golang-k8s-api-dev,
#   golang-k8s-client-go-dev, their closure (about 320 golang-* packages) and a Go toolchain.
# Downloaded with a private apt sources list (the machine's own lists and packages are
# untouched), unpacked with dpkg-deb -x, built in GOPATH mode with no go.mod.
#
# The build is kept outside the checkout, in $TEST_APISERVER_CACHE (default
# .tools/test-apiserver, which .ci/run links into CI's cache), under a key made of the
# package versions used and the source's hash: a machine that built it once does not
# build it again. .tools/steward-test-apiserver is linked to the current build; the tests
# find it there (or at $STEWARD_TEST_APISERVER).
#
# The versions: the pins below are asked for first; Debian's unstable suite keeps only its
# current versions, so when a pin has gone the current one is taken and the key changes.
set -euo pipefail
cd "$(dirname "$0")/.."

PINS=(golang-k8s-apiserver-dev=0.36.4-2 golang-k8s-apiextensions-apiserver-dev=0.36.4-1
      golang-k8s-api-dev golang-k8s-client-go-dev golang-go)

cache=${TEST_APISERVER_CACHE:-$PWD/.tools/test-apiserver}
mkdir -p "$cache" .tools
link=.tools/steward-test-apiserver

debian_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    sed -n -e 's/^[[:space:]]*URIs:[[:space:]]*//p' \
           -e 's/^[[:space:]]*deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' "$f"
  done | tr ' ' '\n' | grep -E '/debian/?$' | head -n1 | sed 's:/*$::'
}

src_hash=$(cat tests/kube-apiserver/*.go scripts/build-test-apiserver.sh | sha256sum | cut -c1-16)

apt_dir="$cache/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/etc"
touch "$apt_dir/status"
apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/etc/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "Dir::State::Status=$apt_dir/status"
  -o APT::Sandbox::User=root)

# The closure's versions: from the index fetched today, or (when the archive cannot be
# reached) from the last build's, so that a machine that built once keeps working offline.
closure_versions() {
  local mirror
  mirror=$(debian_mirror)
  [ -n "$mirror" ] || { echo "no Debian archive in /etc/apt/sources.list{,.d/*}: cannot fetch the API server's sources" >&2; return 1; }
  echo "deb $mirror unstable main" > "$apt_dir/etc/sources.list"
  apt-get "${apt_opts[@]}" update -qq >&2 || return 1
  local names=() p
  for p in "${PINS[@]}"; do names+=("${p%%=*}"); done
  # Every golang-* package the pins depend on, with the version the index offers (a pin
  # that is still offered wins over the current version).
  local closure
  closure=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
      --no-breaks --no-replaces --no-enhances "${names[@]}" 2>/dev/null | grep -E '^golang' | sort -u)
  # One policy call for all of them: the candidate of each.
  # shellcheck disable=SC2086
  apt-cache "${apt_opts[@]}" policy $closure | awk '
    /^[^ ].*:$/ { name = substr($0, 1, length($0) - 1) }
    /^  Candidate:/ { print name "=" $2 }' | while IFS== read -r name candidate; do
      local want="" pin
      for pin in "${PINS[@]}"; do [ "${pin%%=*}" = "$name" ] && [ "$pin" != "$name" ] && want=${pin#*=}; done
      if [ -n "$want" ] && [ "$want" != "$candidate" ] && apt-cache "${apt_opts[@]}" show "$name=$want" >/dev/null 2>&1; then
        echo "$name=$want"
      else
        echo "$name=$candidate"
      fi
    done
}

if versions=$(closure_versions) && [ -n "$versions" ]; then
  key=$(printf '%s\n%s\n' "$versions" "$src_hash" | sha256sum | cut -c1-16)
else
  last=$(readlink "$link" 2>/dev/null || true)
  if [ -n "$last" ] && [ -x "$last" ] && [ "$(cat "$(dirname "$last")/source-hash" 2>/dev/null)" = "$src_hash" ]; then
    echo "the Debian archive cannot be reached: keeping the test API server built before ($last)"
    exit 0
  fi
  echo "the Debian archive cannot be reached and no test API server was built from this source: cannot build it" >&2
  exit 1
fi
out="$cache/build-$key"
if [ -x "$out/steward-test-apiserver" ]; then
  ln -sfn "$out/steward-test-apiserver" "$link"
  echo "test API server: $out/steward-test-apiserver (built before; key $key)"
  exit 0
fi

echo "building the test API server (key $key): $(echo "$versions" | wc -l) Go source packages from Debian unstable"
work=$(mktemp -d "$cache/work-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/root"
(cd "$work/debs" && echo "$versions" | xargs apt-get "${apt_opts[@]}" download -qq)
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
goroot=$(ls -d "$work"/root/usr/lib/go-1.* | sort -V | tail -n1)
[ -x "$goroot/bin/go" ] || { echo "no Go toolchain in the unpacked packages ($work/root/usr/lib)" >&2; exit 1; }
mkdir -p "$out"
start=$(date +%s)
(cd tests/kube-apiserver && \
  GOROOT="$goroot" GOPATH="$work/root/usr/share/gocode" GO111MODULE=off CGO_ENABLED=0 \
  GOCACHE="$cache/go-build-cache" GOFLAGS=-mod= GOTOOLCHAIN=local \
  "$goroot/bin/go" build -trimpath -ldflags='-s -w' -o "$out/steward-test-apiserver.partial" .)
mv "$out/steward-test-apiserver.partial" "$out/steward-test-apiserver"
echo "$versions" > "$out/versions"
echo "$src_hash" > "$out/source-hash"
ln -sfn "$out/steward-test-apiserver" "$link"
echo "test API server built in $(($(date +%s) - start)) s: $out/steward-test-apiserver"
