# syntax=docker/dockerfile:1
# Builds the five commands into one small image; docker-compose.yml picks
# the command per service. Non-root, no shell, static binaries.
FROM golang:1.26-bookworm AS build
WORKDIR /src
# The whole workspace: the commands build in workspace mode, where go.work
# maps the version the modules require one another at to their directories,
# published or not (docs/development.md). The module and build caches
# persist between builds.
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
	CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/api ./cmd/relay ./cmd/reconciler ./cmd/gateway ./cmd/consumer

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot
EXPOSE 8080 8081 8082 8083 8084
ENTRYPOINT []
CMD ["api"]
