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
// reached it a median 2.4 s after the probe that failed on a loaded
// machine (BenchmarkDetection with DISCOVERY_BENCH_TRACE), and its
// refutation then had to spread in what was left. So the member whose
// probe failed also tells the suspect directly, in one UDP packet: the
// suspect re-announces itself alive with a higher incarnation at once
// (memberlist's UpdateNode), which clears the suspicion wherever it
// arrives, as memberlist's own refutation does.

// kindSuspected is the user message that tells a member it is suspected.
// It carries nothing: whoever holds the federation key may send it, and
// all it makes the receiver do is announce itself alive, at most once per
// quiet period (refuteLoop).
const kindSuspected byte = 'U'

// noticeQueue bounds the notices waiting to be sent; more are dropped
// (gossip still carries the suspicion).
const noticeQueue = 32

// noticeAfterStart is how long a member waits after its start before it
// sends notices: while a federation starts, its members' joins are what
// must get through, and with notices from the start 100 members starting
// at once in one process converged in 2.0 s median (up to 20 s) against
// 1.6 s (up to 4.2 s) without.
// A variable so that tests need not wait.
var noticeAfterStart = 10 * time.Second

// refutedLine says whether memberlist logged that it refuted a suspicion
// or a death of this member on its own (it had the accusation by gossip).
func refutedLine(line string) bool {
	return strings.HasPrefix(line, "memberlist: Refuting a suspect message") ||
		strings.HasPrefix(line, "memberlist: Refuting a dead message")
}

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
	started, after := time.Now(), noticeAfterStart
	for {
		select {
		case <-ctx.Done():
			return
		case name := <-d.notices:
			if name == d.selfID || time.Since(started) < after {
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

// refuted notes that memberlist refuted an accusation of this member on
// its own; it is called from memberlist's logger and never blocks.
func (d *Discovery) refuted() {
	d.lastRefute.Store(time.Now().UnixNano())
}

// refuteLoop re-announces this member alive when told it is suspected,
// unless it did (or memberlist did) within quiet: every refutation is an
// alive message all members gossip on, and the probers of one stall
// suspect it together, so a notice sent before the last refutation
// reached the prober is stale. The first version, which refuted on every
// notice once a second, doubled the gossip of 100 loaded members (24
// against 11 KB/s a member) and the suspicions with it. A suspicion
// raised anew within quiet still reaches the member by gossip, which
// memberlist refutes.
func (d *Discovery) refuteLoop(ctx context.Context, quiet time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.refute:
			if time.Since(time.Unix(0, d.lastRefute.Load())) < quiet {
				continue
			}
			d.refuted()
			d.metrics.refutations.Inc()
			// UpdateNode waits for the broadcast to be sent, at most
			// the time given; the alive message spreads either way.
			if err := d.ml.UpdateNode(quiet); err != nil {
				d.log.Debug("refute suspicion", "err", err)
			}
		}
	}
}
