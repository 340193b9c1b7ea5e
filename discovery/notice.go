package discovery

import (
	"context"
	"strings"
	"time"
)

// A member suspected of failure must refute before the suspicion timeout
// (4 s at 100 members) runs out at every member that heard of it, or it is
// declared dead while alive. memberlist tells the suspected member only by
// gossip, which picks 3 random members of n every 200 ms, so the suspicion
// reached it 1 to 3 s (up to 6 s) after the probe that failed on a loaded
// machine (BenchmarkDetection with DISCOVERY_BENCH_TRACE), and its
// refutation then had to spread in what was left. So the member whose
// probe failed also tells the suspect directly, in one UDP packet: the
// suspect re-announces itself alive with a higher incarnation at once
// (memberlist's UpdateNode), which clears the suspicion wherever it
// arrives, as memberlist's own refutation does.

// kindSuspected is the user message that tells a member it is suspected.
// It carries nothing: whoever holds the federation key may send it, and
// all it makes the receiver do is announce itself alive, at most once per
// noticeRefuteEvery.
const kindSuspected byte = 'U'

const (
	// noticeQueue bounds the notices waiting to be sent; more are
	// dropped (gossip still carries the suspicion).
	noticeQueue = 32
	// noticeRefuteEvery bounds how often a member re-announces itself
	// on notices: a burst of probers suspecting it at once needs one
	// refutation.
	noticeRefuteEvery = time.Second
)

// suspectLine is how memberlist logs that this member's probe of another
// failed and it now suspects it: "Suspect <name> has failed, no acks
// received". memberlist has no delegate for it; the words are pinned by
// TestSuspectedMemberIsToldAtOnce.
func suspectLine(line string) (name string, ok bool) {
	rest, ok := strings.CutPrefix(line, "memberlist: Suspect ")
	if !ok {
		return "", false
	}
	name, ok = strings.CutSuffix(rest, " has failed, no acks received")
	return name, ok && name != ""
}

// suspected queues a notice to the member this one just suspected; it is
// called from memberlist's logger and never blocks.
func (d *Discovery) suspected(name string) {
	select {
	case d.notices <- name:
	default:
	}
}

// noticeLoop sends the queued notices.
func (d *Discovery) noticeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case name := <-d.notices:
			if name == d.selfID {
				continue
			}
			for _, n := range d.ml.Members() {
				if n.Name == name {
					if err := d.ml.SendBestEffort(n, []byte{kindSuspected}); err != nil {
						d.log.Debug("tell suspected member", "member", name, "err", err)
					}
					break
				}
			}
		}
	}
}

// refuteLoop re-announces this member alive when told it is suspected.
func (d *Discovery) refuteLoop(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.refute:
			if time.Since(last) < noticeRefuteEvery {
				continue
			}
			last = time.Now()
			d.metrics.refutations.Inc()
			// UpdateNode waits for the broadcast to be sent, at most
			// the time given; the alive message spreads either way.
			if err := d.ml.UpdateNode(noticeRefuteEvery); err != nil {
				d.log.Debug("refute suspicion", "err", err)
			}
		}
	}
}
