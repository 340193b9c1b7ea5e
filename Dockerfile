# The flotilla image, for those who build with a container engine. It is
# the image `make image` builds without one (one static binary and /tmp on
# an empty base); `make image` is what the tests and the demo use.
#   docker build -t flotilla:dev .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X github.com/flotilla-io/flotilla/agent.Version=${VERSION} -X github.com/flotilla-io/flotilla/agent.Commit=${COMMIT}" \
    -o /out/flotilla ./cmd/flotilla && mkdir -m 1777 /out/tmp

FROM scratch
COPY --from=build /out/flotilla /flotilla
COPY --from=build /out/tmp /tmp
ENTRYPOINT ["/flotilla"]
