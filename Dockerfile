# The operator image: the package and its runtime dependencies, nothing of the local test
# cluster (no Go, no control-plane binaries). Not built in this repository's CI (no Docker
# engine there); on a machine that has one:
#
#   docker build -t ghcr.io/cosyvoice-operator/cosyvoice-operator:0.1.0 .
#
# (the chart's default image.repository; push it to your own registry and set image.repository
# and image.digest there).
#
# The base is referenced by tag: its digest could not be looked up where this file was written
# (no registry but PyPI, crates.io, the Go module proxy, npm, Maven Central and Debian's
# reachable), and a digest copied from elsewhere would be unverified. Where you build it, pin
# it: FROM python:3.11-slim@sha256:<the digest `docker buildx imagetools inspect` prints>.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY constraints/operator.txt constraints/operator.txt
COPY operator/ operator/
COPY engine-builder/ engine-builder/
# Every dependency at the exact version constraints/operator.txt names (the versions the
# tests ran with); no hashes (see that file).
RUN pip wheel --no-cache-dir --constraint constraints/operator.txt --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
RUN useradd --uid 1000 --create-home --shell /usr/sbin/nologin operator
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 1000:1000
ENV PYTHONUNBUFFERED=1
ENTRYPOINT ["cosyvoice-operator"]
CMD ["run"]
