#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh machine: a virtualenv in .venv with the
# CPU build of torch, dmem with its test tools and benchmark harness, and the
# Milvus 2.3.5 server wheel in an isolated directory (it would shadow our top-level
# `milvus` package).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=".venv/bin/python -m pip --disable-pip-version-check -q"
# torch first, pinned to the local CPU wheel (a looser pin downloads a CUDA build).
.venv/bin/python -c "import torch" 2>/dev/null || $PIP install torch==2.13.0
# dmem with its server and test extras, and the benchmark harness beside it (bench/:
# `dmem bench ...`, `dmem demo`, `dmem report`, `dmem deploycheck`); again when either
# pyproject.toml changes.
if [ ! -f .venv/.dmem-installed ] || [ pyproject.toml -nt .venv/.dmem-installed ] \
   || [ bench/pyproject.toml -nt .venv/.dmem-installed ]; then
  $PIP install -e '.[test]' -e ./bench
  touch .venv/.dmem-installed
fi
# The minilm-static encoder: distilled once from the bundled MiniLM (cached in
# ~/.cache/dmem, or DMEM_ENCODER__STATIC_PATH; a few minutes on 2 cores).
.venv/bin/python -c "import os, sys; from operators.encoders import distill_static; distill_static(os.environ.get('DMEM_ENCODER__STATIC_PATH'), log=sys.stderr)"
if [ ! -d .cache/milvus-server/milvus ]; then
  $PIP install --no-deps --target .cache/milvus-server milvus==2.3.5
fi
# Java 17 for ScienceWorld (`dmem bench sciworld`; Debian's headless JRE, only when
# `java` is missing and only as root, as in CI).
if ! command -v java >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openjdk-17-jre-headless
fi
# kcat for the librdkafka interop test and `dmem bench embedded` (Debian's package;
# only when missing and only as root, as in CI; elsewhere kcat_ok reports its absence).
if ! command -v kcat >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends kcat
fi
# Headless Chromium for the HTML report test (Debian's package; only when missing
# and only as root, as in CI; elsewhere the test skips with a hint).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium
fi
