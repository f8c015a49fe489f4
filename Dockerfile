# syntax=docker/dockerfile:1
# The EPP image: `epp serve` as a non-root user.
#
# Stage 1 builds a virtual environment from pyproject.toml; stage 2 copies
# only that environment onto a fresh slim Python, so no build tool, compiler
# or source tree reaches the final image. Every dependency ships wheels for
# CPython 3.11 on linux/amd64 and linux/arm64, so the build compiles nothing.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/epp
WORKDIR /src
COPY pyproject.toml README.md ./
COPY epp ./epp
RUN /opt/epp/bin/pip install . \
    && /opt/epp/bin/python -m compileall -q /opt/epp/lib

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/epp/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 65532 epp \
    && useradd --system --uid 65532 --gid epp --no-create-home --shell /usr/sbin/nologin epp
COPY --from=build /opt/epp /opt/epp
USER 65532:65532
# ext_proc gRPC, gRPC health, Prometheus metrics
EXPOSE 9002 9003 9090
ENTRYPOINT ["epp", "serve"]
