# p2ptrain in a container: a build stage that compiles the release binary with the same set-up
# script as CI, and a runtime stage with OpenMPI and the binary. Build it with
#
#   scripts/docker/build.sh            # stages the Rust toolchain, builds the base image if needed
#
# which runs `docker build -t p2ptrain .` after preparing two things this file takes as given:
#
# - BASE, a Debian bookworm image. scripts/docker/base-image.sh makes `p2ptrain/debian:bookworm`
#   from Debian's packages (debootstrap) for engines that cannot pull; where a registry is
#   reachable, `--build-arg BASE=debian:bookworm-slim` is the same system.
# - .docker-stage/rust: the Rust toolchain (cargo, rustc and the x86_64 standard library)
#   copied from the machine that builds, i.e. the toolchain CI builds and tests with. Debian's own
#   rustc is too old for the dependencies (bookworm ships 1.63; trixie's 1.85 is below
#   libloading 0.9's 1.88, which cudarc needs), and rustup's servers may be out of reach, so the
#   compiler comes from the build machine rather than from a download in here.
# - .docker-stage/vendor: the crates Cargo.lock pins (`cargo vendor`), so that the build needs no
#   network access of its own (TLS proxies with their own certificates, offline builders). They
#   are built in a layer of their own, so that editing src/ rebuilds only the crate itself.

ARG BASE=p2ptrain/debian:bookworm

FROM ${BASE} AS build
ENV PATH=/opt/rust/bin:/usr/local/cargo/bin:$PATH \
    CARGO_HOME=/usr/local/cargo \
    CARGO_TERM_COLOR=never
WORKDIR /src
# The same set-up script as CI: OpenMPI and its headers, libclang for bindgen, pkg-config, a C
# compiler and make, cmake and nasm (libjpeg-turbo, linked statically).
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh >/dev/null && rm -rf /var/lib/apt/lists/*
COPY .docker-stage/rust /opt/rust
RUN test -x /opt/rust/bin/cargo || { echo "no Rust toolchain in .docker-stage/rust: build with scripts/docker/build.sh" >&2; exit 1; } \
 && rustc --version && cargo --version
COPY .docker-stage/vendor /src/vendor
RUN mkdir -p .cargo && printf '[source.crates-io]\nreplace-with = "vendored"\n[source.vendored]\ndirectory = "/src/vendor"\n' > .cargo/config.toml
# Dependencies first (a placeholder crate with the real manifest), then the crate.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
 && cargo build --release --locked --offline \
 && rm -rf src
COPY src src
COPY assets assets
COPY config config
COPY data data
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked --offline \
 && ./target/release/p2ptrain --help >/dev/null

FROM ${BASE} AS runtime
# OpenMPI to run under mpirun, and ssh for mpirun to start ranks on other hosts.
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      openmpi-bin openssh-client procps \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/p2ptrain /usr/local/bin/p2ptrain
# The binary embeds the quickstart config and the digits; config/ holds the other examples.
COPY config /opt/p2ptrain/config
# Root in a container is the usual case: let OpenMPI run as root; no single-copy shared memory
# (needs ptrace rights containers do not grant).
ENV OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none
WORKDIR /work
CMD ["p2ptrain", "--help"]
