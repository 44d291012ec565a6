# The gputask image: one image for the operator (`gputask run`) and the node agent (`gputask agent`).
#   docker build -t gputask:dev .
# Two stages so the final image holds the installed package and its dependencies, not the
# build context or pip's build tools. It runs as uid 65532 (non-root) and needs no writable
# root filesystem (the chart mounts an emptyDir on /tmp).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY crds ./crds
COPY examples ./examples
# The agent extra brings nvidia-ml-py (NVML bindings; the driver library comes from the node's
# NVIDIA container runtime) and grpcio/protobuf (the kubelet's PodResources API). sim/test extras are
# left out: the image never plots or tests.
RUN pip install --no-cache-dir --no-compile --prefix=/install ".[agent]"

FROM python:3.11-slim
LABEL org.opencontainers.image.title="gputask" \
      org.opencontainers.image.description="GPU task operator and node agent" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /install /usr/local
# A named user, so getpass and kopf's peering identity work; uid/gid 65532 as in distroless images.
RUN groupadd --gid 65532 gputask \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gputask
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
ENTRYPOINT ["gputask"]
CMD ["--help"]
