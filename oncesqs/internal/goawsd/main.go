// Command goawsd runs goaws (github.com/Admiral-Piett/goaws), an SQS
// emulator speaking SQS's query protocol, on the address given: the tests
// of oncesqs start it as a process of their own, behind the JSON front of
// package sqsfront. goaws keeps its queues in memory only (a restart
// empties them) and reads its queue map without its lock, which is why it
// runs apart from the race-checked test binary.
//
// With -front, it serves that JSON front too, on an address of its own:
// an endpoint aws-sdk-go-v2's service/sqs talks to, in one process (`make
// run BROKER=sqs` runs it so: scripts/services.sh sqs).
//
//	goawsd -addr 127.0.0.1:0 -front 127.0.0.1:9324
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

	"github.com/onceonly/onceonly/oncesqs/internal/sqsfront"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	front := flag.String("front", "", "listen address of the JSON front (empty: none)")
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
	if *front != "" {
		fl, err := net.Listen("tcp", *front)
		if err != nil {
			log.Fatal(err)
		}
		log.Printf("front listening on %s", fl.Addr())
		go func() {
			srv := &http.Server{Handler: sqsfront.New("http://" + ln.Addr().String()), ReadHeaderTimeout: 10 * time.Second}
			log.Fatal(srv.Serve(fl))
		}()
	}
	log.Fatal(http.Serve(ln, router.New()))
}
