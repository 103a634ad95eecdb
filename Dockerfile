# Serving images for LARA Serve (onnxruntime backend). Build with deploy/build_image.sh, which makes the local
# base image and the wheelhouses first; nothing is pulled from an image registry. Two targets:
#   cpu  onnxruntime (CPU), about 345 MB               deploy/build_image.sh           (TARGET=cpu)
#   gpu  onnxruntime-gpu + CUDA 13 wheels, about 2.9 GB  deploy/build_image.sh gpu / make image-gpu
# The cpu stages come first: Docker's classic builder runs every stage up to --target, so `--target cpu` never
# touches the GPU wheels. A plain `docker build .` builds the last target (gpu): pass --target.
ARG BASE=local/debian:bookworm

# ---- build stage: a venv filled offline from the host-built wheelhouse --------------------------------
FROM ${BASE} AS build
ENV DEBIAN_FRONTEND=noninteractive
# Distro packages come from the base's own Debian suite (bookworm), which fixes their versions. g++ builds the
# fused LaraAttention kernel below; it stays in this stage.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv g++ \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
# The fused LaraAttention kernel as an onnxruntime custom-op library (kernels/ort_library.py), compiled here
# (system python3 only: the loader is torch-free) so the runtime image needs no compiler.
WORKDIR /tmp/lara
COPY lara_serve/ /tmp/lara/lara_serve/
COPY kernels/__init__.py kernels/native_build.py kernels/ort_library.py /tmp/lara/lara_serve/kernels/
COPY kernels/csrc/ /tmp/lara/lara_serve/kernels/csrc/
COPY data_cache/onnxruntime-headers/ /tmp/lara/ort-headers/
RUN LARA_ORT_HEADERS=/tmp/lara/ort-headers LARA_KERNEL_CACHE=/tmp/lara/cache python3 -m lara_serve.kernels.ort_library \
    && mkdir -p /opt/lara && cp /tmp/lara/cache/lara_ort-*.so /opt/lara/lara_ort.so
COPY deploy/requirements-serve.txt /tmp/requirements-serve.txt
COPY deploy/wheels/ /tmp/wheels/
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels -r /tmp/requirements-serve.txt \
    && /opt/venv/bin/pip uninstall -y -q pip \
    && find /opt/venv -name __pycache__ -type d -prune -exec rm -rf {} +

# ---- cpu: python3 + the venv + the code; no pip, no wheels, no compilers ------------------------------
FROM ${BASE} AS cpu
ENV DEBIAN_FRONTEND=noninteractive
# libgomp1: the fused kernel's library links the OpenMP runtime (onnxruntime's own pool runs its tasks).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 libgomp1 \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && useradd --system --uid 10001 --user-group --home-dir /app --no-create-home --shell /usr/sbin/nologin lara
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/lara /opt/lara
WORKDIR /app
# The one import name: the top-level folders become lara_serve's subpackages, as in a wheel.
COPY lara_serve/ /app/lara_serve/
COPY server/ /app/lara_serve/server/
COPY clients/ /app/lara_serve/clients/
COPY kernels/__init__.py kernels/native_build.py kernels/ort_library.py /app/lara_serve/kernels/
COPY deploy/docker/healthcheck.py /app/deploy/docker/healthcheck.py
COPY model_repository/ /app/model_repository/
# PATH in full: an imported base (docker import) carries no PATH to extend.
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LARA_HOST=0.0.0.0 \
    LARA_PORT=8000 \
    LARA_BACKEND=onnxruntime \
    LARA_DEVICE=cpu \
    LARA_MODEL_REPOSITORY=/app/model_repository \
    LARA_ORT_LIBRARY=/opt/lara/lara_ort.so \
    LARA_ORT_ATTENTION=fused
USER 10001:10001
EXPOSE 8000
# Liveness only (the process answers); /v2/health/ready also waits for every model to load and warm up.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/app/deploy/docker/healthcheck.py"]
CMD ["python", "-m", "lara_serve.server"]

# ---- build-gpu: the same venv with onnxruntime-gpu and its CUDA 13 / cuDNN 9 wheels instead of onnxruntime ----
FROM ${BASE} AS build-gpu
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY deploy/requirements-serve.txt deploy/requirements-serve-gpu.txt /tmp/
COPY deploy/wheels-gpu/ /tmp/wheels/
# onnxruntime and onnxruntime-gpu both install the `onnxruntime` module: never both. Every other pin is shared.
RUN grep -v '^onnxruntime==' /tmp/requirements-serve.txt >/tmp/requirements-common.txt \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels \
        -r /tmp/requirements-common.txt -r /tmp/requirements-serve-gpu.txt \
    && /opt/venv/bin/pip uninstall -y -q pip \
    && find /opt/venv -name __pycache__ -type d -prune -exec rm -rf {} +

# ---- gpu: as cpu, plus the CUDA libraries of the wheels registered with the dynamic loader -------------
# libcuda.so.1 (the driver) is not in the image: the NVIDIA container toolkit mounts it (docker run --gpus all;
# on Kubernetes the NVIDIA device plugin). Without a GPU, LARA_DEVICE=cuda must refuse to start.
FROM ${BASE} AS gpu
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && useradd --system --uid 10001 --user-group --home-dir /app --no-create-home --shell /usr/sbin/nologin lara
COPY --from=build-gpu /opt/venv /opt/venv
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# onnxruntime finds the pip CUDA libraries only through onnxruntime.preload_dlls(), which the server does not
# call: list their folders in ld.so.conf instead, then prove every library of the CUDA provider resolves but
# the driver's libcuda.so.1, and that cuDNN (loaded later by dlopen) is known to the loader.
RUN find /opt/venv -path '*/site-packages/nvidia/*' -name 'lib*.so*' -printf '%h\n' | sort -u \
        >/etc/ld.so.conf.d/lara-cuda-wheels.conf \
    && ldconfig \
    && provider=$(find /opt/venv -name libonnxruntime_providers_cuda.so) \
    && missing=$(ldd "$provider" | grep 'not found' | grep -v 'libcuda\.so\.1' || true) \
    && if [ -n "$missing" ]; then echo "unresolved CUDA libraries: $missing" >&2; exit 1; fi \
    && ldconfig -p | grep 'libcudnn\.so\.9 ' >/dev/null \
    && ldconfig -p | grep 'libcublasLt\.so\.13 ' >/dev/null
WORKDIR /app
COPY lara_serve/ /app/lara_serve/
COPY server/ /app/lara_serve/server/
COPY clients/ /app/lara_serve/clients/
COPY deploy/docker/healthcheck.py /app/deploy/docker/healthcheck.py
COPY model_repository/ /app/model_repository/
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LARA_HOST=0.0.0.0 \
    LARA_PORT=8000 \
    LARA_BACKEND=onnxruntime \
    LARA_DEVICE=cuda \
    LARA_MODEL_REPOSITORY=/app/model_repository \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "/app/deploy/docker/healthcheck.py"]
CMD ["python", "-m", "lara_serve.server"]
