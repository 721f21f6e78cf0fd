package citus

// Every test database of this package carries the demo's payments table.
import _ "github.com/onceonly/onceonly/demo/demotest"
