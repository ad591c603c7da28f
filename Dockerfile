# syntax=docker/dockerfile:1
#
# triton-emf-exporter: the observability sidecar for a Triton task on ECS.
#
#   VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
#   docker build -t triton-emf-exporter:$VERSION --build-arg VERSION=$VERSION \
#     --build-arg REVISION=$(git rev-parse HEAD) --build-arg CREATED=$(date -u +%FT%TZ) .
#
# The version has one source, pyproject.toml: the package inside reports it from its
# metadata; VERSION only fills the image label.
# The same image runs the model-repository sync daemon (modelsync/, docs/modelsync.md) with another
# entry point:  docker run --entrypoint /opt/venv/bin/python IMAGE -m modelsync --bucket B ...
# (ECS: "entryPoint": ["/opt/venv/bin/python", "-m", "modelsync"], as deploy/stack.yaml does).
# And the fleet's controller (controller/, docs/controller.md): "entryPoint": ["/opt/venv/bin/python", "-m",
# "controller"], as deploy/task-definition-controller.json and the stack's ControllerTaskDefinition do.
#
# Two stages: "build" has pip, setuptools, a C compiler and the project source; the
# final stage gets only the finished virtual environment (locked dependencies + our
# wheel, no pip, no setuptools, no caches, no compilers) and the stdlib-only triton_side/
# folder the Triton container uses, under /opt/triton-health/. No port is exposed: the
# sidecar only sends.
#
# tests/deploy/test_image_install.py replays this file's "build" stage (ENV, WORKDIR,
# COPY, RUN) in a temporary directory and runs the ENTRYPOINT from the result, so
# a change here is tested as written. Keep every install step in a RUN line of
# the "build" stage, and write paths under /opt/ and /src literally.
#
# Pin the base by digest for reproducible builds:
#   docker buildx imagetools inspect python:3.11.14-slim-bookworm   # note the index digest
#   docker build --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest> .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_NO_INPUT=1
WORKDIR /src
COPY requirements.lock pyproject.toml setup.py README.md LICENSE ./
COPY telemetry/ ./telemetry/
COPY catalog/ ./catalog/
COPY triton_http/ ./triton_http/
COPY exporter/ ./exporter/
COPY triton_side/ ./triton_side/
COPY modelsync/ ./modelsync/
COPY controller/ ./controller/
COPY render/ ./render/

# A C compiler for the optional /metrics scanner (exporter/sources/_scan.c, ~2x faster parsing);
# it stays in this stage. OS packages only: the replay test skips this step.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev

# Build tools get their own venv, pinned by hash, and never reach the final image.
RUN python -m venv /opt/build \
 && printf '%s\n' 'setuptools==80.9.0 --hash=sha256:062d34222ad13e0cc312a4c02d73f059e86a4acbfbdea8f8f76b28c99f306922 --hash=sha256:f36b47402ecde768dbfafc46e8e4207b4360c654f1f3bb84475f0a28628fb19c' > /opt/build/build.lock \
 && /opt/build/bin/pip install --require-hashes --only-binary=:all: --no-deps -r /opt/build/build.lock

# Runtime venv without pip: every dependency comes from requirements.lock, by hash,
# as a wheel (--only-binary: nothing is compiled), and nothing else is resolved.
RUN python -m venv --without-pip /opt/venv \
 && /opt/build/bin/pip --python /opt/venv/bin/python install --require-hashes --only-binary=:all: --no-deps -r requirements.lock

# Our own package (with the C scanner): built offline with the pinned setuptools, installed
# without deps, then pip check proves the lock satisfies every requirement the wheels declare.
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --no-index --wheel-dir /opt/build/dist . \
 && /opt/build/bin/pip --python /opt/venv/bin/python install --no-deps --no-index /opt/build/dist/*.whl \
 && /opt/build/bin/pip --python /opt/venv/bin/python check


FROM ${PYTHON_IMAGE}
ARG VERSION=unknown
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="triton-emf-exporter" \
      org.opencontainers.image.description="Sidecar that turns NVIDIA Triton metrics, model states and NVML GPU telemetry into CloudWatch Embedded Metric Format" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.documentation="docs/deploy.md"

# A fixed numeric uid so ECS and file permissions never depend on /etc/passwd order.
RUN groupadd --system --gid 10001 exporter \
 && useradd --system --uid 10001 --gid exporter --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin exporter

COPY --from=build /opt/venv /opt/venv
# Published for the Triton image: COPY --from=<this image> /opt/triton-health/ /opt/triton-health/
COPY triton_side/ /opt/triton-health/

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
ENTRYPOINT ["/opt/venv/bin/python", "-m", "exporter"]
