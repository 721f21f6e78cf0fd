package main

// Every test database of this package carries the demo's payments table,
// which the harness writes.
import _ "github.com/onceonly/onceonly/demo/demotest"
