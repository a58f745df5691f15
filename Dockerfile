# syntax=docker/dockerfile:1
# ingot: one image for `ingot serve` workers and `ingot route` (deploy/k8s).
#
#   docker build -t ingot .                          # router and CPU workers
#   docker build -t ingot-cuda \
#     --build-arg RUNTIME_BASE=nvidia/cuda:13.0.1-runtime-ubuntu24.04 .
#
# The CUDA kernels are compiled in the builder by the pinned nvcc that
# scripts/fetch-nvcc also installs (from PyPI); the binary loads the driver,
# NVRTC and cuBLASLt at run time, so the default slim runtime runs the router
# and CPU workers, and GPU workers use the CUDA runtime base (which ships
# cuBLASLt; the NVIDIA container toolkit mounts the driver).

ARG RUNTIME_BASE=debian:bookworm-slim

FROM rust:1.95-bookworm AS builder
# Unpinned apt packages (DL3008): the Debian stable archive drops superseded
# versions, so exact pins break the build; stable only takes fixes.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-pip \
    && rm -rf /var/lib/apt/lists/*
# The same pins as scripts/fetch-nvcc (CUDA 13.0: driver 580 accepts it).
RUN pip3 install --break-system-packages --no-cache-dir --no-deps --target /opt/nvcc \
        nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 \
        nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85
ENV CUDA_HOME=/opt/nvcc/nvidia/cu13 INGOT_REQUIRE_CUDA_KERNELS=1
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p ingot \
    && install -D target/release/ingot /out/ingot

FROM ${RUNTIME_BASE} AS runtime
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --create-home ingot
COPY --from=builder /out/ingot /usr/local/bin/ingot
USER 10001
EXPOSE 8000 8080
ENTRYPOINT ["/usr/local/bin/ingot"]
CMD ["--help"]
