package deploytest

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/stretchr/testify/require"
)

// root is the repository's directory, where docker-compose.yml, the Dockerfile
// and cmd/ are, relative to this package's.
const root = "../../.."

// commands are the mains of cmd/ and the subcommands each accepts as its
// first argument in a container command.
var commands = map[string][]string{
	"api":        {"migrate", "keys", "probe"},
	"relay":      {"--once"},
	"reconciler": {"--once"},
	"gateway":    {},
	"consumer":   {"publish"},
}

// brokers are the services each consumer service consumes from.
var brokers = map[string]string{"consumer": "nats", "consumer-rabbitmq": "rabbitmq", "consumer-kafka": "kafka", "consumer-sqs": "elasticmq"}

// TestComposeFile loads docker-compose.yml with the compose-spec loader (no
// engine runs here) and checks the wiring: every service's command exists in
// this project, the daemons wait for a healthy Redis and a finished
// migration, everything has a health check, and no secret is written down;
// the profiles kafka and sqs add a consumer on each, wired the same way.
func TestComposeFile(t *testing.T) {
	compose := filepath.Join(root, "docker-compose.yml")
	for _, profiles := range [][]string{nil, {"kafka"}, {"sqs"}} {
		name := "profile " + strings.Join(profiles, ",")
		if profiles == nil {
			name = "no profile"
		}
		t.Run(name, func(t *testing.T) {
			want := []string{"api", "consumer", "consumer-rabbitmq", "gateway", "grafana", "migrate", "nats", "postgres", "prometheus", "rabbitmq", "reconciler", "redis", "relay"}
			for _, p := range profiles {
				want = append(want, map[string][]string{"kafka": {"kafka", "consumer-kafka"}, "sqs": {"elasticmq", "consumer-sqs"}}[p]...)
			}
			checkCompose(t, compose, profiles, want)
		})
	}
}

// checkCompose loads the compose file with profiles on and checks that it
// holds the services want, wired as TestComposeFile says.
func checkCompose(t *testing.T, compose string, profiles, want []string) {
	opts, err := cli.NewProjectOptions([]string{compose},
		cli.WithWorkingDirectory(root), cli.WithName("onceonly"), cli.WithProfiles(profiles),
		cli.WithEnv([]string{"POSTGRES_PASSWORD=test-only", "RABBITMQ_PASSWORD=test-only-mq", "API_KEYS=sk_x=acct_x"}))
	require.NoError(t, err)
	project, err := opts.LoadProject(context.Background())
	require.NoError(t, err)
	require.ElementsMatch(t, want, project.ServiceNames())

	for name, svc := range project.Services {
		if svc.Image != "" && svc.Build == nil {
			require.NotNil(t, svc.HealthCheck, "%s has a health check", name)
			for _, v := range svc.Volumes {
				if v.Type == "bind" {
					_, err := os.Stat(v.Source)
					require.NoError(t, err, "%s mounts %s, which exists", name, v.Source)
				}
			}
			continue
		}
		require.NotNil(t, svc.Build, "%s is built from this project", name)
		require.NotEmpty(t, svc.Command, name)
		main := svc.Command[0]
		require.Contains(t, commands, main, "%s runs a command of cmd/", name)
		_, err := os.Stat(filepath.Join(root, "cmd", main, "main.go"))
		require.NoError(t, err, "%s: cmd/%s exists", name, main)
		if len(svc.Command) > 1 {
			require.Contains(t, commands[main], svc.Command[1], "%s: %v", name, svc.Command)
		}
		require.Contains(t, svc.Environment, "DATABASE_URL", name)
		require.Contains(t, *svc.Environment["DATABASE_URL"], "test-only", "the password comes from the environment")
		if name == "migrate" {
			require.Equal(t, "service_healthy", svc.DependsOn["postgres"].Condition)
			continue
		}
		if name == "gateway" { // the demo's gateway needs Postgres only
			require.Equal(t, "service_healthy", svc.DependsOn["postgres"].Condition)
			require.NotNil(t, svc.HealthCheck, name)
			continue
		}
		require.NotNil(t, svc.HealthCheck, name)
		require.Equal(t, []string{"CMD", "api", "probe"}, []string(svc.HealthCheck.Test[:3]), name)
		require.Equal(t, "service_completed_successfully", svc.DependsOn["migrate"].Condition, name)
		require.Equal(t, "service_healthy", svc.DependsOn["redis"].Condition, name)
		if broker, ok := brokers[name]; ok { // a consumer waits for its broker and reads it
			require.Equal(t, "service_healthy", svc.DependsOn[broker].Condition, name)
			u, err := url.Parse(*svc.Environment["BROKER_URL"])
			require.NoError(t, err, name)
			require.Equal(t, broker, u.Hostname(), "%s reads %s", name, broker)
		}
	}
	require.Contains(t, *project.Services["consumer-rabbitmq"].Environment["BROKER_URL"], "test-only-mq", "the broker's password comes from the environment")
	require.Equal(t, "test-only-mq", *project.Services["rabbitmq"].Environment["RABBITMQ_DEFAULT_PASS"])

	raw, err := os.ReadFile(compose)
	require.NoError(t, err)
	require.NotRegexp(t, `(?im)^\s*\w*(password|api_keys):\s*[^$\s]`, string(raw), "no literal secrets")

	// Without a password the file refuses to load rather than run open (one
	// missing at a time: which of two the loader names first varies).
	opts, err = cli.NewProjectOptions([]string{compose}, cli.WithWorkingDirectory(root), cli.WithEnv([]string{"RABBITMQ_PASSWORD=test-only-mq"}))
	require.NoError(t, err)
	_, err = opts.LoadProject(context.Background())
	require.ErrorContains(t, err, "POSTGRES_PASSWORD")
	opts, err = cli.NewProjectOptions([]string{compose}, cli.WithWorkingDirectory(root), cli.WithEnv([]string{"POSTGRES_PASSWORD=test-only"}))
	require.NoError(t, err)
	_, err = opts.LoadProject(context.Background())
	require.ErrorContains(t, err, "RABBITMQ_PASSWORD")
}

// TestDockerfileBuildsEveryCommand checks that the image contains every main
// of cmd/ and runs as a non-root user.
func TestDockerfileBuildsEveryCommand(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	require.NoError(t, err)
	text := string(raw)
	for main := range commands {
		require.Contains(t, text, "./cmd/"+main, "the image builds %s", main)
	}
	dirs, err := os.ReadDir(filepath.Join(root, "cmd"))
	require.NoError(t, err)
	for _, d := range dirs {
		if !d.IsDir() || d.Name() == "internal" {
			continue // the module's go.mod and go.sum, its internal packages
		}
		require.Contains(t, commands, d.Name(), "cmd/%s is listed here and built into the image", d.Name())
	}
	stages := strings.Count(text, "\nFROM ") + 1
	require.GreaterOrEqual(t, stages, 2, "multi-stage")
	lines := strings.Split(strings.TrimSpace(text), "\n")
	require.True(t, slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "USER nonroot") }))
}
