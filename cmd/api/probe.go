package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// probe is a health check for images without a shell or curl: it exits 0
// when url answers 200 within 2 s.
func probe(args []string, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "api probe: say one URL")
		return 2
	}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, args[0], nil) //nolint:gosec // G704: probing the URL its operator names is the command's job
	if err != nil {
		fmt.Fprintln(stderr, "api probe:", err)
		return 1
	}
	c := &http.Client{Timeout: 2 * time.Second}
	res, err := c.Do(req) //nolint:gosec // G704: as above
	if err != nil {
		fmt.Fprintln(stderr, "api probe:", err)
		return 1
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "api probe: %s answered %d\n", args[0], res.StatusCode)
		return 1
	}
	return 0
}
