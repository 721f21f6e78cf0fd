# syntax=docker/dockerfile:1
# Builds the five commands into one small image; docker-compose.yml picks
# the command per service. Non-root, no shell, static binaries.
FROM golang:1.26-bookworm AS build
WORKDIR /src
# The workspace: the library's module, the broker packages' (the consumer
# imports them) and the commands' (cmd/go.mod), whose dependencies are
# downloaded before the sources come in.
COPY go.mod go.sum ./
COPY oncenats/go.mod oncenats/go.sum ./oncenats/
COPY onceamqp/go.mod onceamqp/go.sum ./onceamqp/
COPY demo/go.mod demo/go.sum ./demo/
COPY cmd/go.mod cmd/go.sum ./cmd/
RUN cd cmd && GOWORK=off go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/api ./cmd/relay ./cmd/reconciler ./cmd/gateway ./cmd/consumer

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot
EXPOSE 8080 8081 8082 8083 8084
ENTRYPOINT []
CMD ["api"]
