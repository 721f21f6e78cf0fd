package main

import (
	"context"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
)

// Containers are started once per test process and left to the Ryuk reaper
// of testcontainers-go, which removes them when the process exits.

func dockerHealthy(ctx context.Context) error {
	provider, err := testcontainers.NewDockerProvider()
	if err != nil {
		return fmt.Errorf("no Docker engine: %w", err)
	}
	defer provider.Close()
	if err := provider.Health(ctx); err != nil {
		return fmt.Errorf("no Docker engine: %w", err)
	}
	return nil
}

func postgresContainer() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := dockerHealthy(ctx); err != nil {
		return "", fmt.Errorf("TEST_DATABASE_URL is unset and %w", err)
	}
	ctr, err := tcpostgres.Run(ctx, "postgres:15-alpine",
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		return "", fmt.Errorf("start Postgres container: %w", err)
	}
	connURL, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return "", fmt.Errorf("read the Postgres container's URL: %w", err)
	}
	return connURL, nil
}

func redisContainer() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := dockerHealthy(ctx); err != nil {
		return "", fmt.Errorf("TEST_REDIS_URL is unset and %w", err)
	}
	ctr, err := tcredis.Run(ctx, "redis:7")
	if err != nil {
		return "", fmt.Errorf("start Redis container: %w", err)
	}
	connURL, err := ctr.ConnectionString(ctx)
	if err != nil {
		return "", fmt.Errorf("read the Redis container's URL: %w", err)
	}
	return connURL, nil
}
