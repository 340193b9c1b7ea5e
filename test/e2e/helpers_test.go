// Package e2e holds end-to-end tests: real control planes, real network
// sites, real agent processes.
package e2e

import (
	"net"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/harness"
)

// freeAddr returns a loopback address with a port that was free a moment
// ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitFor polls check until it passes, the process exits, or timeout.
func waitFor(t *testing.T, p *harness.Process, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if exited, werr := p.Exited(); exited {
			t.Fatalf("%s exited (%v) while waiting: %v\n%s", p.Name, werr, err, p.Tail(20))
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v\n%s", timeout, err, p.Tail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
