# The stock Triton image plus the stdlib-only triton_side/ folder, whose two commands the
# task definition runs:
#   /opt/triton-health/startup_check.py  before tritonserver (GPU, driver, CUDA)
#   /opt/triton-health/health.py         as the ECS healthCheck
# Build from the repository root (the root .dockerignore lets triton_side/ through):
#   docker build -f deploy/triton.Dockerfile --build-arg TRITON_TAG=24.10-py3 -t triton-server:24.10 .
# Or, without this repository, copy them from the published sidecar image:
#   COPY --from=<account>.dkr.ecr.<region>.amazonaws.com/triton-emf-exporter:<tag> /opt/triton-health/ /opt/triton-health/
ARG TRITON_TAG=24.10-py3
FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}

COPY triton_side/ /opt/triton-health/

# Fail the build, not the task, if this image's python3 cannot run them, and compile them
# now: the health check starts every 30 s and then loads its modules from __pycache__.
RUN python3 /opt/triton-health/startup_check.py --help >/dev/null \
 && python3 /opt/triton-health/health.py --help >/dev/null \
 && python3 -m compileall -q /opt/triton-health
