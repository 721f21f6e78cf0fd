// Package sqstest starts a stand-in SQS for tests: goaws, an SQS
// emulator, as a process of its own behind a JSON front (aws-sdk-go-v2's
// service/sqs speaks the JSON protocol, goaws the query one): an endpoint
// service/sqs talks to as it talks to SQS. The tests of oncesqs and of the
// demo consumer (cmd/consumer) use it; Start builds goaws with the go
// command, from the module cache, so it is for tests, not production.
package sqstest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/onceonly/onceonly/oncesqs/internal/sqsfront"
)

// Server is a goaws process and the front before it.
type Server struct {
	// Endpoint is the front's URL: an SQS endpoint (sqs.Options.BaseEndpoint).
	Endpoint string
	// Goaws is goaws's own URL (the query protocol).
	Goaws string

	dir   string
	cmd   *exec.Cmd
	front *httptest.Server
}

// Start builds goaws (cmd internal/goawsd, from the module cache) and
// starts it on a free port, and the front before it.
func Start() (*Server, error) {
	dir, err := os.MkdirTemp("", "oncesqs-goaws-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir}
	bin := filepath.Join(dir, "goawsd")
	build := exec.Command("go", "build", "-o", bin, "github.com/onceonly/onceonly/oncesqs/internal/goawsd")
	if out, err := build.CombinedOutput(); err != nil {
		s.Close()
		return nil, fmt.Errorf("build goaws: %w\n%s", err, out)
	}
	s.cmd = exec.Command(bin, "-addr", "127.0.0.1:0")
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		s.Close()
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		s.Close()
		return nil, fmt.Errorf("start goaws: %w", err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				addr <- a
			}
		}
	}()
	select {
	case a := <-addr:
		s.Goaws = "http://" + a
	case <-time.After(30 * time.Second):
		s.Close()
		return nil, errors.New("goaws did not start listening within 30s")
	}
	s.front = httptest.NewServer(sqsfront.New(s.Goaws))
	s.Endpoint = s.front.URL
	return s, nil
}

// RestartFront closes the front, dropping every connection (Close waits
// for the calls under way, a long poll up to its wait), and serves it again
// on the same address: an outage of the endpoint, while goaws keeps its
// queues (it keeps nothing across a restart of its own). The chaos suite's
// broker restart on SQS is this.
func (s *Server) RestartFront() error {
	addr := s.front.Listener.Addr().String()
	s.front.CloseClientConnections()
	s.front.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("serve the front again on %s: %w", addr, err)
	}
	front := httptest.NewUnstartedServer(sqsfront.New(s.Goaws))
	_ = front.Listener.Close()
	front.Listener = ln
	front.Start()
	s.front = front
	return nil
}

// Close stops the front and goaws, and removes its binary.
func (s *Server) Close() {
	if s.front != nil {
		s.front.Close()
	}
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
	_ = os.RemoveAll(s.dir)
}

// Client returns an SQS client of endpoint with dummy credentials.
func Client(endpoint string) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "sqstest"}, nil
		}),
		HTTPClient: &http.Client{Timeout: 60 * time.Second},
	})
}

// CreateQueue creates a queue (attributes as SQS takes them:
// VisibilityTimeout, RedrivePolicy…) and returns its URL.
func CreateQueue(ctx context.Context, c *sqs.Client, name string, attributes map[string]string) (string, error) {
	out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attributes})
	if err != nil {
		return "", err
	}
	return aws.ToString(out.QueueUrl), nil
}

// Attr returns the string value of m's message attribute name, "" without
// one.
func Attr(m types.Message, name string) string {
	return aws.ToString(m.MessageAttributes[name].StringValue)
}

// Depth returns how many messages the queue at url holds, visible or in
// flight (SQS's approximate counts; goaws's exact ones).
func Depth(ctx context.Context, c *sqs.Client, url string) (int, error) {
	names := []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}
	out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url), AttributeNames: names})
	if err != nil {
		return 0, fmt.Errorf("the queue's attributes: %w", err)
	}
	n := 0
	for _, a := range names {
		v, err := strconv.Atoi(out.Attributes[string(a)])
		if err != nil {
			return 0, fmt.Errorf("the queue's attributes: no %s", a)
		}
		n += v
	}
	return n, nil
}
