# The reference ledger worker in a thin image, for machines without a
# registry: scripts/docker-images.sh compiles ./examples/ledger-consumer on
# the machine (where the build cache makes it quick) and builds this next to
# the binary. The user, entrypoint and command are
# those of docker/ledger-consumer/Dockerfile, the build docker compose runs
# where images can be pulled.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN useradd --system --no-create-home ledger
COPY ledger-consumer /usr/local/bin/ledger-consumer
USER ledger
ENTRYPOINT ["ledger-consumer"]
CMD ["worker", "--migrate"]
