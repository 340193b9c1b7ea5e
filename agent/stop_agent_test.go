package agent

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// A real agent asked to stop at any point of its start (before its
// components run, while its informers list, while it joins its peer,
// once running) stops cleanly within its shutdown timeout: exit status
// 0 and "agent stopped" logged. Agents stopped 0.1 and 0.36 s after
// start hung in their shared informers and exited 1: an event handler
// read a kind whose informer, made after the stop, never synced.
func TestAgentStopsCleanlyAtAnyPointOfItsStart(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	harness.Require(t, harness.NeedsNetwork...)
	env := harness.New(t)
	cs := federation.New(t, env, federation.Options{PodCIDRs: []string{"10.244.0.0/16", "10.245.0.0/16"}})
	federation.Connect(t, cs)
	b := cs[1]
	// Every 200 ms of the first two seconds and more: it once hung
	// 360 ms in, and once 100 ms.
	for i := range 12 {
		after := time.Duration(i) * 200 * time.Millisecond
		if err := b.Agent.Stop(); err != nil {
			t.Fatalf("stop b's agent before the try %s after start: %v\n%s", after, err, b.Agent.Tail(40))
		}
		// The log is appended to: this start's line is one more.
		starts := strings.Count(b.Agent.Log(), `msg="agent starting"`)
		stops := strings.Count(b.Agent.Log(), `msg="agent stopped"`)
		b.StartAgent(t)
		eventually.Within(t, time.Minute, "b's agent starting", func() error {
			if exited, err := b.Agent.Exited(); exited {
				t.Fatalf("b's agent exited while starting: %v\n%s", err, b.Agent.Tail(20))
			}
			if strings.Count(b.Agent.Log(), `msg="agent starting"`) == starts {
				return fmt.Errorf("not logged yet")
			}
			return nil
		})
		time.Sleep(after)
		lines := strings.Count(b.Agent.Log(), "\n")
		if err := b.Agent.Stop(); err != nil {
			t.Fatalf("stopped %s after it started: %v\n%s", after, err, b.Agent.Tail(60))
		}
		if strings.Count(b.Agent.Log(), `msg="agent stopped"`) == stops {
			t.Fatalf("stopped %s after it started: exit 0 without \"agent stopped\"\n%s", after, b.Agent.Tail(20))
		}
		t.Logf("stopped %s after it started, cleanly; the log had %d lines", after, lines)
	}
	// And it still joins after all that.
	b.StartAgent(t)
	federation.WaitPhases(t, cs, v1alpha1.PhaseConnected, 90*time.Second)
}
