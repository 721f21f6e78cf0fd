// Command testservers runs a command (the tests) against Postgres and Redis
// containers started through testcontainers-go, for machines with a Docker
// engine and no local servers:
//
//	go run ./tools/testservers -- go test -race ./...
//
// It sets TEST_DATABASE_URL and TEST_REDIS_URL for the command, exits with
// its exit code, and leaves the containers to testcontainers-go's reaper,
// which removes them when this process ends. It is a module of its own, so
// that testcontainers-go is no requirement of the library's module.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run())
}

func run() int {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: testservers -- COMMAND [ARG...]")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := os.Environ()
	if os.Getenv("TEST_DATABASE_URL") == "" {
		u, err := postgresContainer()
		if err != nil {
			fmt.Fprintln(os.Stderr, "testservers:", err)
			return 1
		}
		env = append(env, "TEST_DATABASE_URL="+u)
	}
	if os.Getenv("TEST_REDIS_URL") == "" {
		u, err := redisContainer()
		if err != nil {
			fmt.Fprintln(os.Stderr, "testservers:", err)
			return 1
		}
		env = append(env, "TEST_REDIS_URL="+u)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...) //nolint:gosec // the caller's own command
	cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = env, os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	default:
		fmt.Fprintln(os.Stderr, "testservers:", err)
		return 1
	}
}
