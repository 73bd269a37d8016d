# The operator image: the package and its runtime dependencies, nothing of the local test
# cluster (no Go, no control-plane binaries). Not built in this repository's CI (no Docker
# engine there); `docker build -t cosyvoice-operator .` on a machine that has one.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY engine-builder/ engine-builder/
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 1000 --create-home --shell /usr/sbin/nologin operator
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 1000:1000
ENV PYTHONUNBUFFERED=1
ENTRYPOINT ["cosyvoice-operator"]
CMD ["run"]
