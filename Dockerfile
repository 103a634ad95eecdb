# CPU serving image for LARA Serve (onnxruntime backend). Build with deploy/build_image.sh, which makes the
# local base image and the wheelhouse deploy/wheels first; nothing is pulled from an image registry.
ARG BASE=local/debian:bookworm

# ---- build stage: a venv filled offline from the host-built wheelhouse --------------------------------
FROM ${BASE} AS build
ENV DEBIAN_FRONTEND=noninteractive
# Distro packages come from the base's own Debian suite (bookworm), which fixes their versions.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY deploy/requirements-serve.txt /tmp/requirements-serve.txt
COPY deploy/wheels/ /tmp/wheels/
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels -r /tmp/requirements-serve.txt \
    && /opt/venv/bin/pip uninstall -y -q pip \
    && find /opt/venv -name __pycache__ -type d -prune -exec rm -rf {} +

# ---- runtime stage: python3 + the venv + the code; no pip, no wheels, no compilers --------------------
FROM ${BASE}
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && useradd --system --uid 10001 --user-group --home-dir /app --no-create-home --shell /usr/sbin/nologin lara
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY server/ /app/server/
COPY clients/ /app/clients/
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
    LARA_MODEL_REPOSITORY=/app/model_repository
USER 10001:10001
EXPOSE 8000
# Liveness only (the process answers); /v2/health/ready also waits for every model to load and warm up.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/app/deploy/docker/healthcheck.py"]
CMD ["python", "-m", "server"]
