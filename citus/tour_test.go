package citus

import (
	"strings"
	"testing"

	"github.com/onceonly/onceonly/oncetest"
)

// TestTour runs the tour (make tour: demo/tour) against the whole
// system on Citus: the gateway, the api, the relay, the reconciler and the
// demo consumer on NATS JetStream, all with DATABASE_URL at the
// coordinator. The tour fails on the first step that does not behave; it
// must also run every step (none skipped).
func TestTour(t *testing.T) {
	s := newStack(t)
	nats := oncetest.NewNATSServer(t)
	gw := s.start(t, "gateway", "gateway")
	charge := "GATEWAY_URL=" + baseURL(gw)
	api := s.start(t, "api", "api", charge)
	s.start(t, "relay", "relay", "DATABASE_SESSION_URL="+s.db)
	s.start(t, "reconciler", "reconciler")
	consumer := s.start(t, "consumer", "consumer", charge, "BROKER_URL="+nats.URL())

	out := runCommand(t, bins+"/tour", append(append([]string{}, s.env...),
		"TOUR_API="+baseURL(api), "TOUR_GATEWAY_URL="+baseURL(gw), "TOUR_CONSUMER="+baseURL(consumer), "BROKER_URL="+nats.URL()),
		"-api-bin", bins+"/api", "-gateway-bin", bins+"/gateway", "-consumer-bin", bins+"/consumer")
	t.Logf("tour:\n%s", out)
	if strings.Contains(out, "skipped") {
		t.Error("the tour skipped a step")
	}
	if !strings.Contains(out, "== 8.") {
		t.Error("the tour did not reach its eighth step")
	}
}
