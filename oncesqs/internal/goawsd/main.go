// Command goawsd runs goaws (github.com/Admiral-Piett/goaws), an SQS
// emulator speaking SQS's query protocol, on the address given: the tests
// of oncesqs start it as a process of their own, behind the JSON front of
// package sqsfront. goaws keeps its queues in memory only (a restart
// empties them) and reads its queue map without its lock, which is why it
// runs apart from the race-checked test binary.
package main

import (
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/Admiral-Piett/goaws/app"
	"github.com/Admiral-Piett/goaws/app/gosqs"
	"github.com/Admiral-Piett/goaws/app/router"
	"github.com/sirupsen/logrus"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	flag.Parse()
	logrus.SetOutput(io.Discard)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	app.CurrentEnvironment = app.Environment{
		Host: host, Port: port, AccountID: "queue", EnableDuplicates: true,
		QueueAttributeDefaults: app.EnvQueueAttributes{VisibilityTimeout: 30, MaximumMessageSize: 262144},
	}
	go gosqs.PeriodicTasks(time.Second, make(chan struct{}))
	// The listening address, for the process that started this one.
	log.SetFlags(0)
	log.Printf("listening on %s", ln.Addr())
	log.Fatal(http.Serve(ln, router.New()))
}
