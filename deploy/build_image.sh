#!/usr/bin/env bash
# Build a serving image offline: local Debian base (debootstrap), host-built wheelhouse, docker build.
#
#   deploy/build_image.sh                     # -> lara-serve:cpu  (Dockerfile target cpu)
#   deploy/build_image.sh gpu                 # -> lara-serve:gpu  (target gpu, ~2.9 GB; also `make image-gpu`)
#   IMAGE=lara-serve:dev deploy/build_image.sh
#
# Needs a running Docker daemon (as root: apt-get install -y docker.io debootstrap, then a private daemon:
# eval "$(deploy/ci/dockerd.sh start /tmp/lara-docker)"), and root for debootstrap the first time. No image
# registry is used: the base is made here and the Dockerfile takes it as the build argument BASE. Env knobs:
#   IMAGE     tag to build                   (default lara-serve:<target>)
#   BASE      base image tag                 (default local/debian:bookworm; built if missing)
#   BASE_TAR  cache file of the base's root filesystem: imported if present, written after a debootstrap
#   MIRROR    Debian mirror for debootstrap  (default http://deb.debian.org/debian)
#   PIP       pip that downloads the wheels  (default .venv/bin/pip; any CPython 3.11 pip works)
#   KEEP_WHEELS=1  keep deploy/wheels-gpu after a gpu build (it is in the build context of every later build)
set -euo pipefail

cd "$(dirname "$0")/.."
TARGET=${1:-${TARGET:-cpu}}
case $TARGET in cpu | gpu) ;; *) echo "target must be cpu or gpu, not $TARGET" >&2; exit 2 ;; esac
IMAGE=${IMAGE:-lara-serve:$TARGET}
BASE=${BASE:-local/debian:bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
PIP=${PIP:-.venv/bin/pip}

docker info >/dev/null 2>&1 || { echo "no Docker daemon; start one: deploy/ci/dockerd.sh start DIR" >&2; exit 1; }

# 1. Base image: a minimal Debian bookworm root filesystem, imported as $BASE (debootstrap: about 35 s, once).
import_base() {
    docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' - "$BASE"
}
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    if [ -n "${BASE_TAR:-}" ] && [ -s "$BASE_TAR" ]; then
        echo "importing base $BASE from $BASE_TAR"
        import_base <"$BASE_TAR"
    else
        command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install -y debootstrap" >&2; exit 1; }
        rootfs=$(mktemp -d /tmp/lara-rootfs.XXXXXX)
        trap 'rm -rf "$rootfs"' EXIT
        echo "building base $BASE with debootstrap in $rootfs"
        debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR"
        # debootstrap lists only the release; add its updates and security suites for the image's apt-get.
        cat >"$rootfs/etc/apt/sources.list" <<SOURCES
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        if [ -n "${BASE_TAR:-}" ]; then
            # Written whole, then renamed: a run killed half-way never leaves a truncated cache.
            mkdir -p "$(dirname "$BASE_TAR")"
            tar -C "$rootfs" -cf "$BASE_TAR.part" . && mv "$BASE_TAR.part" "$BASE_TAR"
            import_base <"$BASE_TAR"
        else
            tar -C "$rootfs" -c . | import_base
        fi
    fi
fi

# 2. Wheelhouse: binary wheels for the image's CPython 3.11 on x86_64 (bookworm has glibc 2.36), pinned by
#    deploy/requirements-serve*.txt. The Dockerfile installs from it with --no-index: no index in the build.
download() {  # download DIR REQUIREMENTS...
    local dir=$1
    shift
    mkdir -p "$dir"
    "$PIP" download -q -d "$dir" "$@" \
        --only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
    echo "wheelhouse $dir: $(find "$dir" -name '*.whl' | wc -l) wheels, $(du -sh "$dir" | cut -f1)"
}
# The cpu stages run for either target (the classic builder builds every stage up to --target).
download deploy/wheels -r deploy/requirements-serve.txt
if [ "$TARGET" = gpu ]; then
    common=$(mktemp /tmp/lara-req.XXXXXX)
    grep -v '^onnxruntime==' deploy/requirements-serve.txt >"$common"
    download deploy/wheels-gpu -r "$common" -r deploy/requirements-serve-gpu.txt
    rm -f "$common"
fi

# The fused LaraAttention kernel is compiled in the image's build stage against onnxruntime's C API headers,
# which `make setup` / `make serve` unpack from npm into data_cache/ (not in git).
if [ ! -f data_cache/onnxruntime-headers/onnxruntime_c_api.h ]; then
    echo "data_cache/onnxruntime-headers/ is missing: run make data_cache/onnxruntime-headers/onnxruntime_c_api.h" >&2
    exit 1
fi

# 3. The image. model_repository/ must exist for COPY (it may be empty: then mount models at run time).
mkdir -p model_repository
if ! compgen -G "model_repository/*/config.json" >/dev/null; then
    echo "note: model_repository/ has no model; run the image with -v REPO:/models -e LARA_MODEL_REPOSITORY=/models"
fi
# The image runs as uid 10001: every served file must be world-readable (COPY keeps modes).
unreadable=$(find model_repository \( -name '*.onnx' -o -name '*.json' \) ! -perm -o=r -print)
if [ -n "$unreadable" ]; then
    echo "not world-readable (the server runs as uid 10001): $unreadable; chmod a+r them" >&2
    exit 1
fi
# DOCKER_BUILDKIT=0: the classic builder works with Debian's daemon and needs no buildx plugin or frontend image.
DOCKER_BUILDKIT=0 docker build --network host --build-arg "BASE=$BASE" --target "$TARGET" -t "$IMAGE" .
if [ "$TARGET" = gpu ] && [ "${KEEP_WHEELS:-0}" != 1 ]; then
    rm -rf deploy/wheels-gpu  # 1.5 GB: it would be sent as build context with every later build
fi
docker image ls "$IMAGE"
