package discovery

import (
	"context"
	"encoding/binary"
	"strings"
	"sync"
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
// After the kind it may carry, as a uvarint, how many milliseconds before
// sending it the prober last heard an alive message about the suspect
// (none: never, or a member that does not say). Whoever holds the
// federation key may send it, and all it makes the receiver do is
// announce itself alive, at most once per quiet period unless the age
// shows that the prober had heard its last announcement (refuteLoop).
const kindSuspected byte = 'U'

// maxNoticeAge bounds the age a notice can carry; a larger one reads as
// none.
const maxNoticeAge = time.Hour

// noticeOf is the notice to a suspect of which an alive message was last
// heard age ago; a negative age: never.
func noticeOf(age time.Duration) []byte {
	b := []byte{kindSuspected}
	if age < 0 || age > maxNoticeAge {
		return b
	}
	return binary.AppendUvarint(b, uint64(age.Milliseconds()))
}

// parseNotice reads the age a notice carries (after its kind byte); ok is
// false when it carries none, or nothing readable (which then counts as
// a notice without an age, as older members send).
func parseNotice(b []byte) (age time.Duration, ok bool) {
	ms, n := binary.Uvarint(b)
	if n <= 0 || n != len(b) || ms > uint64(maxNoticeAge.Milliseconds()) ||
		n != len(binary.AppendUvarint(nil, ms)) { // one encoding of each age
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// heardAlive is when an alive message about each member was last heard
// (unix ns, by cluster ID): whatever its incarnation, and push/pull
// states included, as memberlist reports them to NotifyAlive.
type heardAlive struct {
	mu sync.Mutex
	at map[string]int64
}

func (h *heardAlive) heard(id string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.at == nil {
		h.at = map[string]int64{}
	}
	h.at[id] = now.UnixNano()
}

func (h *heardAlive) forget(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.at, id)
}

// age is how long ago an alive message about id was heard; negative if
// never.
func (h *heardAlive) age(id string, now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.at[id]
	if !ok {
		return -1
	}
	return now.Sub(time.Unix(0, at))
}

// refuteNow decides whether a notice calls for a refutation, sinceRefute
// after this member's last one. Beyond quiet, always. Within it, only if
// the notice says its prober had heard an alive message about this
// member after that refutation: then it suspected the incarnation this
// member holds now, which nothing else will refute before gossip brings
// the suspicion here. Otherwise the prober suspected an older
// incarnation, and the refutation already on its way clears that.
func refuteNow(sinceRefute, age time.Duration, aged bool, quiet time.Duration) bool {
	return sinceRefute >= quiet || (aged && age < sinceRefute)
}

// noticeQueue bounds the notices waiting to be sent; more are dropped
// (gossip still carries the suspicion).
const noticeQueue = 32

// noticeAfterStart is how long at most a member waits after its start
// before it sends notices, and noticeSettle how long without a member
// joining ends the wait earlier: while a federation starts, its members'
// joins are what must get through, and with notices from the start 100
// members starting at once in one process converged in 2.0 s median (up
// to 20 s) against 1.6 s (up to 4.2 s) without. Once the joins have
// stopped, a member without notices only risks its peers' lives: the
// suspicions of those first seconds reach the suspect by gossip alone.
// Variables so that tests need not wait.
var (
	noticeAfterStart = 10 * time.Second
	noticeSettle     = 2 * time.Second
)

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
	started, after, settle := time.Now(), noticeAfterStart, noticeSettle
	for {
		select {
		case <-ctx.Done():
			return
		case name := <-d.notices:
			now := time.Now()
			joining := now.Sub(time.Unix(0, d.lastJoin.Load())) < settle
			if name == d.selfID || (now.Sub(started) < after && joining) {
				continue
			}
			for _, n := range d.ml.Members() {
				if n.Name == name {
					if err := d.ml.SendBestEffort(n, noticeOf(d.heard.age(name, now))); err != nil {
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
// as refuteNow decides: every refutation is an alive message all members
// gossip on, and the probers of one stall suspect it together, so a
// notice sent before the last refutation reached the prober is stale.
// The first version, which refuted on every notice once a second, doubled
// the gossip of 100 loaded members (24 against 11 KB/s a member) and the
// suspicions with it; one that refuted at most once per quiet period left
// a member suspected anew within it to gossip, which on a loaded machine
// brought the suspicion too late.
func (d *Discovery) refuteLoop(ctx context.Context, quiet time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-d.refute:
			since := time.Since(time.Unix(0, d.lastRefute.Load()))
			if !refuteNow(since, n.age, n.aged, quiet) {
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

// notice is a notice received: the age it carries, if any.
type notice struct {
	age  time.Duration
	aged bool
}
