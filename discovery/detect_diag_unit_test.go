package discovery

import (
	"log"
	"testing"
)

// TestLogTapKeepsSuspicionsAndRefutations pins the memberlist lines the
// detection benchmark explains false deaths with: if an upgrade of
// memberlist rewords them, the benchmark would report no suspicion and no
// refutation instead of failing.
func TestLogTapKeepsSuspicionsAndRefutations(t *testing.T) {
	for _, tc := range []struct {
		line  string
		want  memberEvent
		empty bool
	}{
		{line: "[INFO] memberlist: Suspect b2 has failed, no acks received", want: memberEvent{Kind: "suspect", About: "b2"}},
		{line: "[INFO] memberlist: Marking b2 as failed, suspect timeout reached (2 peer confirmations)", want: memberEvent{Kind: "timeout", About: "b2", N: 2}},
		{line: "[WARN] memberlist: Refuting a suspect message (from: c3)", want: memberEvent{Kind: "refute"}},
		{line: "[WARN] memberlist: Refuting a dead message (from: c3)", want: memberEvent{Kind: "refute-dead"}},
		{line: "[WARN] memberlist: handler queue full, dropping message (3) from=127.0.0.1:1", want: memberEvent{Kind: "queue-full"}},
		{line: "[DEBUG] memberlist: Failed UDP ping: b2 (timeout reached)", empty: true},
	} {
		sink := &eventLog{}
		log.New(logTap{member: "a1", sink: sink}, "", 0).Print(tc.line)
		got := sink.take()
		if tc.empty {
			if len(got) != 0 {
				t.Errorf("%q: kept %+v, want nothing", tc.line, got)
			}
			continue
		}
		if len(got) != 1 {
			t.Fatalf("%q: kept %d events, want 1", tc.line, len(got))
		}
		got[0].At = 0
		tc.want.Member = "a1"
		if got[0] != tc.want {
			t.Errorf("%q: kept %+v, want %+v", tc.line, got[0], tc.want)
		}
	}
}
