#!/usr/bin/env bash
# Build the CPU serving image offline: local Debian base (debootstrap), host-built wheelhouse, docker build.
#
#   deploy/build_image.sh                     # -> lara-serve:cpu
#   IMAGE=lara-serve:dev deploy/build_image.sh
#
# Needs a running Docker daemon (as root: apt-get install -y docker.io debootstrap; dockerd --data-root DIR &),
# and root for debootstrap the first time. No image registry is used: the base is made here and the
# Dockerfile takes it as the build argument BASE. Env knobs:
#   IMAGE   tag to build                   (default lara-serve:cpu)
#   BASE    base image tag                 (default local/debian:bookworm; built if missing)
#   MIRROR  Debian mirror for debootstrap  (default http://deb.debian.org/debian)
#   PIP     pip that downloads the wheels  (default .venv/bin/pip; any CPython 3.11 pip works)
set -euo pipefail

cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-lara-serve:cpu}
BASE=${BASE:-local/debian:bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
PIP=${PIP:-.venv/bin/pip}
WHEELS=deploy/wheels

docker info >/dev/null 2>&1 || { echo "no Docker daemon; start one (dockerd --data-root DIR &)" >&2; exit 1; }

# 1. Base image: a minimal Debian bookworm root filesystem, imported as $BASE (about 35 s, once).
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
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
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' - "$BASE"
fi

# 2. Wheelhouse: binary wheels for the image's CPython 3.11 on x86_64 (bookworm has glibc 2.36), pinned by
#    deploy/requirements-serve.txt. The Dockerfile installs from it with --no-index: no index in the build.
mkdir -p "$WHEELS"
"$PIP" download -q -d "$WHEELS" -r deploy/requirements-serve.txt \
    --only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
echo "wheelhouse: $(find "$WHEELS" -name '*.whl' | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1)"

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
docker build --network host --build-arg "BASE=$BASE" -t "$IMAGE" .
docker image ls "$IMAGE"
