#!/usr/bin/env bash
# Runs a local three-member etcd cluster managed by etcd-steward on this machine: a dnsmasq
# serving the StatefulSet names on 127.0.9.1, and three "pods" on 127.0.9.10-12, each an
# `etcd-steward init` (which execs etcd) in its own mount namespace plus an
# `etcd-steward sidecar`. Needs root. Ctrl-C stops everything; data stays in $DIR.
#
#   sudo scripts/local-cluster.sh            # DIR defaults to /tmp/etcd-steward-local
#   curl 127.0.9.10:8080/ready
#   .tools/etcd-v3.5.1/etcdctl --endpoints 127.0.9.10:2379 member list -w table
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${DIR:-/tmp/etcd-steward-local}
NET=127.0.9
REPLICAS=${REPLICAS:-3}
ETCD=${ETCD_BIN:-$PWD/.tools/etcd-v3.5.1/etcd}
[ -x "$ETCD" ] || bash scripts/install-test-deps.sh >/dev/null
cargo build --release --locked --quiet
STEWARD=$PWD/target/release/etcd-steward
mkdir -p "$DIR"
echo "nameserver $NET.1" > "$DIR/resolv.conf"
# The control token the sidecars and the commands share (recover --yes, restore --yes).
[ -s "$DIR/control-token" ] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$DIR/control-token"
: > "$DIR/hosts"
for o in $(seq 0 $((REPLICAS - 1))); do
  echo "$NET.$((10 + o)) etcd-$o.etcd.default.svc.cluster.local" >> "$DIR/hosts"
done
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; echo "stopped; data and logs in $DIR"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
dnsmasq --keep-in-foreground --no-resolv --no-hosts --bind-interfaces --port=53 --user=root \
  --local-ttl=0 --no-negcache --listen-address=$NET.1 --addn-hosts="$DIR/hosts" \
  --local=/cluster.local/ --log-facility=- 2>/dev/null & pids+=($!)
sleep 0.3
for o in $(seq 0 $((REPLICAS - 1))); do
  mkdir -p "$DIR/pod-$o"
  args=(--name "etcd-$o" --replicas "$REPLICAS" --data-dir "$DIR/pod-$o/data" --listen-ip "$NET.$((10 + o))" --dns-server "$NET.1:53"
    --control-token-file "$DIR/control-token")
  "$STEWARD" sidecar "${args[@]}" 2>> "$DIR/pod-$o/sidecar.log" & pids+=($!)
  unshare --mount --propagation private sh -c 'mount --bind "$0" /etc/resolv.conf && exec "$@"' "$DIR/resolv.conf" \
    "$STEWARD" init "${args[@]}" --etcd-bin "$ETCD" 2>> "$DIR/pod-$o/etcd.log" & pids+=($!)
done
echo "starting $REPLICAS pods; logs in $DIR/pod-*/{etcd,sidecar}.log"
for o in $(seq 0 $((REPLICAS - 1))); do
  until curl -sf "$NET.$((10 + o)):8080/ready" >/dev/null 2>&1; do sleep 0.5; done
  echo "etcd-$o ready: $(curl -s "$NET.$((10 + o)):8080/ready")"
done
echo "cluster ready; Ctrl-C to stop"
wait
