// Command kfakeserver runs franz-go's kfake, a Kafka broker in one
// process, for oncekafka's tests: a process of its own so that a test can
// stop it (SIGTERM, or SIGKILL) and start it again on the same port and
// data directory, which keeps the records and the committed offsets.
//
//	kfakeserver -port 0 -data-dir /tmp/k -partitions 3
//
// It prints "listening <host:port>" on stdout once it serves, and shuts
// down cleanly (flushing its data directory) on SIGTERM or SIGINT.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	port := flag.Int("port", 0, "port to listen on (0: any free port)")
	dataDir := flag.String("data-dir", "", "directory keeping records and offsets across restarts (empty: in memory)")
	partitions := flag.Int("partitions", 3, "partitions of a topic created without a count")
	flag.Parse()

	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(*port),
		kfake.DefaultNumPartitions(*partitions),
		kfake.AllowAutoTopicCreation(),
		// Tests let group members come and go quickly.
		kfake.GroupMinSessionTimeout(100e6), // 100ms
		kfake.BrokerConfigs(map[string]string{"group.initial.rebalance.delay.ms": "0"}),
	}
	if *dataDir != "" {
		opts = append(opts, kfake.DataDir(*dataDir), kfake.SyncWrites())
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kfakeserver:", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stdout, "listening", c.ListenAddrs()[0])

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	c.Close()
}
