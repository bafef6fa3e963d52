# The idemq binary (cmd/idemq), as a static, non-root image.
#
#   docker build -t idemq .
#   docker run --rm -e DATABASE_URL=postgres://app@db:5432/shop idemq migrate
#   docker run --rm -e DATABASE_URL=... -p 9090:9090 idemq relay --config /etc/idemq/relay.json --http-addr :9090
#
# The build context is the repository root: cmd/idemq is a module of its
# own whose go.mod replaces github.com/idemq/idemq with ../.., the library
# in this tree. examples/deploy has a config file, a systemd unit and
# Kubernetes manifests for the image.

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
COPY cmd/idemq/go.mod cmd/idemq/go.sum ./cmd/idemq/
RUN cd cmd/idemq && go mod download
COPY . .
# Static (no cgo), without local paths; the module version and the VCS
# revision are what `idemq version` prints.
RUN cd cmd/idemq && CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags='-s -w' -o /out/idemq .

# distroless/static: CA certificates (for TLS to Postgres, Kafka, NATS and
# webhook endpoints), tzdata and /etc/passwd with the nonroot user, no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/idemq /usr/local/bin/idemq
# 65532 is distroless's nonroot; numeric so that runAsNonRoot can verify it.
USER 65532:65532
# /metrics, /healthz and /readyz when the relay runs with --http-addr :9090.
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/idemq"]
CMD ["--help"]
