# The delivery-ledger image: one image for every role (worker, projector, dashboard, api,
# and the one-shot keys/certs/topics steps of docker-compose.yml, which sets each
# service's command and healthcheck).
#
#   docker build -t delivery-ledger .                  (FROM python:3.11-slim-bookworm)
#   scripts/image                                      (podman, a base made by debootstrap)
#
# BASE is any Debian-like image with python3 (>= 3.11) and its venv module: the official
# Python image by default; scripts/image passes one built from Debian's own packages,
# for machines that reach no image registry. Both stages start from it, so the venv's
# interpreter is the same file in both.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS builder
WORKDIR /src
# The locked dependencies first (their layer is reused until the lock changes), every file
# checked against its hash. A TLS-intercepting proxy's CA may be handed in as the secret
# ca-bundle (scripts/image does); it is mounted for this step only, never in a layer.
COPY requirements.lock ./
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && python3 -m venv /opt/ledger \
    && /opt/ledger/bin/pip install --no-cache-dir --no-input --require-hashes -r requirements.lock
# Then the project, without dependencies and without build isolation: its build backend
# is the locked setuptools just installed.
COPY pyproject.toml README.md ./
COPY events ./events
COPY config ./config
COPY clients ./clients
COPY streams ./streams
COPY projections ./projections
COPY ledger ./ledger
COPY receiver ./receiver
COPY api ./api
RUN /opt/ledger/bin/pip install --no-cache-dir --no-input --no-deps --no-build-isolation . \
    && /opt/ledger/bin/ledger --version

FROM ${BASE}
# uid 1000: the apache/kafka image's own user, which reads the broker keystore that the
# certs step (running as this user) writes with mode 0600.
RUN useradd --uid 1000 --user-group --no-create-home --home-dir /data --shell /usr/sbin/nologin ledger \
    && mkdir -p /data/keys /certs \
    && chown -R ledger:ledger /data /certs \
    && chmod 0700 /data/keys
COPY --from=builder /opt/ledger /opt/ledger
ENV PATH=/opt/ledger/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LEDGER_DATA_DIR=/data
USER ledger
WORKDIR /data
# Compose sets a healthcheck per role (worker: its metrics port; dashboard: /healthz;
# projector: `ledger status`); this default only says that the installed CLI starts.
HEALTHCHECK --interval=30s --timeout=20s --start-period=20s --retries=3 CMD ["ledger", "--version"]
CMD ["ledger", "--help"]
