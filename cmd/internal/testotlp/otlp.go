// Package testotlp is an OTLP/HTTP trace collector for tests of the commands' tracing.
package testotlp

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is a span an OTLPCollector received.
type Span struct {
	Service, Name, TraceID string
}

// OTLPCollector is an OTLP/HTTP trace endpoint (protobuf) that keeps what it
// receives.
type OTLPCollector struct {
	URL   string
	mu    sync.Mutex
	spans []Span
}

// NewOTLPCollector starts a collector for the test.
func NewOTLPCollector(tb testing.TB) *OTLPCollector {
	tb.Helper()
	c := &OTLPCollector{}
	srv := httptest.NewServer(http.HandlerFunc(c.export))
	tb.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

func (c *OTLPCollector) export(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req collectortrace.ExportTraceServiceRequest
	if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, Span{Service: service, Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId())})
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
}

// Spans returns what the collector received so far.
func (c *OTLPCollector) Spans() []Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Span(nil), c.spans...)
}

// Find returns the spans named name, of any service when service is "".
func (c *OTLPCollector) Find(service, name string) []Span {
	var out []Span
	for _, s := range c.Spans() {
		if s.Name == name && (service == "" || s.Service == service) {
			out = append(out, s)
		}
	}
	return out
}
