# The flotilla image: one static binary on a distroless base. The agent
# runs as root with only NET_ADMIN and NET_RAW (see deploy/deployment.yaml).
# No container engine exists on the development machines, so this file is
# not built by `make test`: docker build -t ghcr.io/flotilla-io/flotilla:dev .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X github.com/flotilla-io/flotilla/agent.Version=${VERSION} -X github.com/flotilla-io/flotilla/agent.Commit=${COMMIT}" \
    -o /out/flotilla ./cmd/flotilla

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/flotilla /flotilla
ENTRYPOINT ["/flotilla"]
