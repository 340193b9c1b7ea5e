package discovery

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
)

// What BenchmarkDetection in member groups records to explain a false
// death: a false death needs a suspected member to fail to refute for the
// whole suspicion timeout (4 s at 100 members), so each group reports how
// long its process stalled, what its members' memberlist logged about
// suspicions and refutations, and the parent reads the kernel's UDP
// receive errors around the run.

// stallMeter measures how late a 50 ms ticker fires in this process: the
// lateness of a goroutine that only sleeps is how long the process could
// not run (descheduled, a garbage collection stopping the world, or the Go
// scheduler behind on runnable goroutines).
type stallMeter struct {
	mu     sync.Mutex
	window []time.Duration // lateness of every tick since the last mark
	stalls []stallSpan     // ticks late by more than stallNoted, all run
	stop   chan struct{}
	done   chan struct{}
}

// stallSpan is one late tick: when it fired and how late.
type stallSpan struct {
	End  int64 `json:"end"` // unix ns
	Late int64 `json:"late"`
}

const (
	stallTick  = 50 * time.Millisecond
	stallNoted = 200 * time.Millisecond
)

func startStallMeter() *stallMeter {
	s := &stallMeter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(stallTick)
		defer t.Stop()
		prev := time.Now()
		for {
			select {
			case <-s.stop:
				return
			case now := <-t.C:
				// The ticker drops ticks a stalled process missed, so the
				// gap since the last one is the stall.
				late := max(time.Since(prev)-stallTick, 0)
				prev = time.Now()
				s.mu.Lock()
				s.window = append(s.window, late)
				if late > stallNoted {
					s.stalls = append(s.stalls, stallSpan{End: now.UnixNano(), Late: int64(late)})
				}
				s.mu.Unlock()
			}
		}
	}()
	return s
}

func (s *stallMeter) close() {
	close(s.stop)
	<-s.done
}

// mark returns the largest and the 99th percentile lateness since the
// last mark and starts a new window.
func (s *stallMeter) mark() (maxLate, p99 time.Duration) {
	s.mu.Lock()
	w := s.window
	s.window = nil
	s.mu.Unlock()
	if len(w) == 0 {
		return 0, 0
	}
	slices.Sort(w)
	return w[len(w)-1], w[len(w)*99/100]
}

// memberEvent is one line of a member's memberlist log that matters to a
// false death.
type memberEvent struct {
	At     int64  `json:"at"`     // unix ns
	Kind   string `json:"kind"`   // see logTap
	Member string `json:"member"` // whose log
	About  string `json:"about"`  // the member it is about, if any
	N      int    `json:"n"`      // peer confirmations of a suspicion timeout
}

// logTap is a member's memberlist logger in a member group: it keeps the
// lines about suspicions and refutations, with the time they were logged.
type logTap struct {
	member string
	sink   *eventLog
}

type eventLog struct {
	mu     sync.Mutex
	events []memberEvent
}

func (l *eventLog) take() []memberEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.events
	l.events = nil
	return e
}

// The memberlist lines kept, by the kind they are recorded as:
//
//	suspect   "Suspect X has failed, no acks received": this member's
//	          probe of X failed, it suspects X
//	timeout   "Marking X as failed, suspect timeout reached (N peer
//	          confirmations)": its suspicion timer for X fired
//	refute    "Refuting a suspect message": it was suspected and refuted
//	refute-dead "Refuting a dead message": it was declared dead and refuted
//	queue-full "handler queue full": a gossip message dropped unread
func (t logTap) Write(p []byte) (int, error) {
	line := string(p)
	now := time.Now().UnixNano()
	ev := memberEvent{At: now, Member: t.member}
	switch {
	case strings.Contains(line, "memberlist: Suspect "):
		ev.Kind = "suspect"
		ev.About = wordAfter(line, "memberlist: Suspect ")
	case strings.Contains(line, "suspect timeout reached"):
		ev.Kind = "timeout"
		ev.About = wordAfter(line, "memberlist: Marking ")
		if _, rest, ok := strings.Cut(line, "reached ("); ok {
			ev.N, _ = strconv.Atoi(strings.Fields(rest)[0])
		}
	case strings.Contains(line, "Refuting a suspect message"):
		ev.Kind = "refute"
	case strings.Contains(line, "Refuting a dead message"):
		ev.Kind = "refute-dead"
	case strings.Contains(line, "handler queue full"):
		ev.Kind = "queue-full"
	default:
		return len(p), nil
	}
	t.sink.mu.Lock()
	t.sink.events = append(t.sink.events, ev)
	t.sink.mu.Unlock()
	return len(p), nil
}

func wordAfter(line, prefix string) string {
	_, rest, _ := strings.Cut(line, prefix)
	if f := strings.Fields(rest); len(f) > 0 {
		return f[0]
	}
	return ""
}

// groupDiag is what a member group reports with "diag".
type groupDiag struct {
	Stalls []stallSpan `json:"stalls"`
	// Lateness of the 50 ms ticker while observed and while detecting.
	ObserveMax int64         `json:"observe_max"`
	ObserveP99 int64         `json:"observe_p99"`
	DetectMax  int64         `json:"detect_max"`
	DetectP99  int64         `json:"detect_p99"`
	Events     []memberEvent `json:"events"`
	Members    []string      `json:"members"`
	RcvBuf     int           `json:"rcvbuf"` // SO_RCVBUF of a gossip socket, as the kernel set it
	// Refutations its members made when told by a prober (notice.go).
	NoticeRefutes int `json:"notice_refutes"`
}

// udpCounters are the kernel's UDP counters of this network namespace.
type udpCounters struct {
	InDatagrams, InErrors, RcvbufErrors int64
}

func readUDPCounters() (udpCounters, error) {
	f, err := os.Open("/proc/net/snmp")
	if err != nil {
		return udpCounters{}, err
	}
	defer f.Close()
	var names []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) == 0 || fields[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = fields
			continue
		}
		var c udpCounters
		for i, v := range fields {
			n, _ := strconv.ParseInt(v, 10, 64)
			switch names[i] {
			case "InDatagrams":
				c.InDatagrams = n
			case "InErrors":
				c.InErrors = n
			case "RcvbufErrors":
				c.RcvbufErrors = n
			}
		}
		return c, nil
	}
	return udpCounters{}, fmt.Errorf("no Udp line in /proc/net/snmp")
}

// socketRcvBuf is the receive buffer the kernel gave the transport's UDP
// socket (Linux reports twice what was asked, for its bookkeeping).
func socketRcvBuf(t *transport) int {
	raw, err := t.udp.SyscallConn()
	if err != nil {
		return -1
	}
	size := -1
	_ = raw.Control(func(fd uintptr) {
		size, _ = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
	})
	return size
}

// falseDeathCause is the evidence around one false death: the member M
// first marked failed at At by Observer's suspicion timer.
type falseDeathCause struct {
	member, observer string
	suspicions       int // of M, by distinct probers, before At
	at               time.Time
	confirmations    int
	suspectedAt      time.Time // the first suspicion of M before At
	suspectedBy      string
	refutedAt        []time.Duration // M's refutations, relative to the suspicion
	memberStall      time.Duration   // M's process: longest stall from the suspicion to At
	observerStall    time.Duration   // the observer's process, same span

	// With DISCOVERY_BENCH_TRACE: when M's transport first read a
	// suspicion of M, and when the observer's transport read M's alive
	// message with the incarnation of M's first refutation after the
	// suspicion (zero: not seen).
	gotSuspect, observerGotRefute time.Time
}

// explainFalseDeaths matches every member marked failed by a suspicion
// timeout (while alive) with its suspicion, its refutations and the
// stalls of its process and of the observer's.
func explainFalseDeaths(diags []groupDiag, falseDead map[string]bool) []falseDeathCause {
	groupOf := map[string]int{}
	var events []memberEvent
	for i, d := range diags {
		for _, m := range d.Members {
			groupOf[m] = i
		}
		events = append(events, d.Events...)
	}
	slices.SortFunc(events, func(a, b memberEvent) int { return int(a.At - b.At) })
	longest := func(g int, from, to time.Time) time.Duration {
		var l time.Duration
		for _, s := range diags[g].Stalls {
			// A stall spans [End-Late, End]; count it if it overlaps.
			if s.End >= from.UnixNano() && s.End-s.Late <= to.UnixNano() {
				l = max(l, time.Duration(s.Late))
			}
		}
		return l
	}
	var out []falseDeathCause
	seen := map[string]bool{}
	for _, ev := range events {
		if ev.Kind != "timeout" || !falseDead[ev.About] || seen[ev.About] {
			continue
		}
		seen[ev.About] = true
		c := falseDeathCause{member: ev.About, observer: ev.Member, at: time.Unix(0, ev.At), confirmations: ev.N}
		// The suspicion that led to it: with both confirmations the
		// observer's timer ran the shortest timeout (4 s at 100 members
		// with ProfileLAN), so the last suspicion of M by then; with
		// fewer, up to 24 s, so the first within the 30 s before.
		for _, s := range events {
			if s.At > ev.At {
				break
			}
			if s.At < ev.At-int64(30*time.Second) || s.Kind != "suspect" || s.About != ev.About {
				continue
			}
			c.suspicions++
			switch {
			case ev.N >= 2 && s.At <= ev.At-int64(3900*time.Millisecond):
				c.suspectedAt, c.suspectedBy = time.Unix(0, s.At), s.Member
			case ev.N < 2 && c.suspectedAt.IsZero():
				c.suspectedAt, c.suspectedBy = time.Unix(0, s.At), s.Member
			}
		}
		if c.suspectedAt.IsZero() {
			c.suspectedAt = c.at // no suspicion seen: refutations and stalls from the death on
		}
		for _, r := range events {
			if (r.Kind == "refute" || r.Kind == "refute-dead") && r.Member == ev.About &&
				r.At >= c.suspectedAt.UnixNano()-int64(time.Second) && r.At <= ev.At+int64(10*time.Second) {
				c.refutedAt = append(c.refutedAt, time.Duration(r.At-c.suspectedAt.UnixNano()))
			}
		}
		var refuteAt int64
		for _, r := range events {
			if r.Kind == "refute" && r.Member == ev.About && r.At >= c.suspectedAt.UnixNano()-int64(time.Second) {
				refuteAt = r.At
				break
			}
		}
		for _, r := range events {
			if r.Kind == "got-suspect" && r.Member == ev.About && r.At >= c.suspectedAt.UnixNano()-int64(time.Second) && c.gotSuspect.IsZero() {
				c.gotSuspect = time.Unix(0, r.At)
			}
			if refuteAt != 0 && r.Kind == "got-alive" && r.Member == ev.Member && r.About == ev.About && r.At >= refuteAt && c.observerGotRefute.IsZero() {
				c.observerGotRefute = time.Unix(0, r.At)
			}
		}
		if g, ok := groupOf[ev.About]; ok {
			c.memberStall = longest(g, c.suspectedAt.Add(-time.Second), c.at)
		}
		if g, ok := groupOf[ev.Member]; ok {
			c.observerStall = longest(g, c.suspectedAt, c.at)
		}
		out = append(out, c)
	}
	return out
}

func (c falseDeathCause) relativeTo(t0 time.Time) string {
	refuted := "never"
	if len(c.refutedAt) > 0 {
		var s []string
		for _, r := range c.refutedAt {
			s = append(s, fmt.Sprintf("%+.2fs", r.Seconds()))
		}
		refuted = strings.Join(s, " ")
	}
	rel := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return fmt.Sprintf("%+.2fs", t.Sub(c.suspectedAt).Seconds())
	}
	return fmt.Sprintf("false death %.8s: first suspected by %.8s at %+.2fs (%d suspicions), marked failed by %.8s at %+.2fs (%d confirmations); after the first suspicion: it read a suspicion at %s, refuted at %s, the observer read the refutation at %s, marked it failed at %s; longest stall of its process %.2fs, of the observer's %.2fs",
		c.member, c.suspectedBy, c.suspectedAt.Sub(t0).Seconds(), c.suspicions, c.observer, c.at.Sub(t0).Seconds(), c.confirmations, rel(c.gotSuspect), refuted, rel(c.observerGotRefute), rel(c.at), c.memberStall.Seconds(), c.observerStall.Seconds())
}

// tracingTransport reads what a member receives (DISCOVERY_BENCH_TRACE
// set): it decrypts every packet with the benchmark's key and records the
// first suspicion of the member itself at each incarnation ("got-suspect")
// and every alive message about another member with an incarnation newer
// than any it has received ("got-alive"), at the time the transport read
// the packet. Against memberlist's own log lines this tells whether a
// refutation was late on the wire or late in the process.
type tracingTransport struct {
	memberlist.NodeAwareTransport
	self    string
	sink    *eventLog
	aead    cipher.AEAD
	packets chan *memberlist.Packet
	done    chan struct{}
	once    sync.Once

	incs        map[string]uint32 // newest incarnation received per member
	suspectedAt uint32            // incarnation of the last suspicion of self recorded, plus one
	debug       bool
}

func newTracingTransport(inner memberlist.NodeAwareTransport, self string, key []byte, sink *eventLog) *tracingTransport {
	t := &tracingTransport{NodeAwareTransport: inner, self: self, sink: sink, aead: newGossipAEAD(key),
		packets: make(chan *memberlist.Packet), done: make(chan struct{}), incs: map[string]uint32{}}
	go func() {
		for {
			select {
			case p := <-inner.PacketCh():
				t.inspect(p)
				select {
				case t.packets <- p:
				case <-t.done:
					return
				}
			case <-t.done:
				return
			}
		}
	}()
	return t
}

func (t *tracingTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *tracingTransport) Shutdown() error {
	t.once.Do(func() { close(t.done) })
	return t.NodeAwareTransport.Shutdown()
}

// Message types of memberlist's wire format (net.go) read here.
const (
	mlAck      = 2
	mlSuspect  = 3
	mlAlive    = 4
	mlDead     = 5
	mlCompound = 7
	mlUser     = 8
	mlHasCRC   = 12
)

func (t *tracingTransport) inspect(p *memberlist.Packet) {
	at := p.Timestamp.UnixNano()
	for _, m := range gossipMessages(t.aead, p.Buf) {
		t.message(m, at)
	}
}

// gossipMessages decrypts a memberlist packet sealed with aead and returns
// the messages in it, each starting with its type byte.
func gossipMessages(aead cipher.AEAD, buf []byte) [][]byte {
	// Encryption version 1: version byte, 12-byte nonce, sealed message.
	if len(buf) < 1+12+16 || buf[0] != 1 {
		return nil
	}
	plain, err := aead.Open(nil, buf[1:13], buf[13:], nil)
	if err != nil {
		return nil
	}
	if len(plain) >= 5 && plain[0] == mlHasCRC {
		plain = plain[5:]
	}
	if len(plain) < 2 || plain[0] != mlCompound {
		return [][]byte{plain}
	}
	parts := plain[1:]
	n := int(parts[0])
	parts = parts[1:]
	if len(parts) < 2*n {
		return nil
	}
	lens := parts[:2*n]
	parts = parts[2*n:]
	var out [][]byte
	for i := range n {
		l := int(lens[2*i])<<8 | int(lens[2*i+1])
		if l > len(parts) {
			break
		}
		out = append(out, parts[:l])
		parts = parts[l:]
	}
	return out
}

func newGossipAEAD(key []byte) cipher.AEAD {
	block, err := aes.NewCipher(key)
	if err != nil {
		panic(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return aead
}

func (t *tracingTransport) message(m []byte, at int64) {
	if len(m) < 2 || (m[0] != mlSuspect && m[0] != mlAlive) {
		return
	}
	inc, node, ok := incarnationAndNode(m[1:])
	if !ok {
		return
	}
	switch {
	case m[0] == mlSuspect && node == t.self && inc+1 > t.suspectedAt:
		t.suspectedAt = inc + 1
		t.record(memberEvent{At: at, Kind: "got-suspect", Member: t.self, N: int(inc)})
	case m[0] == mlAlive && node != t.self:
		if old, seen := t.incs[node]; seen && inc <= old {
			return
		}
		t.incs[node] = inc
		t.record(memberEvent{At: at, Kind: "got-alive", Member: t.self, About: node, N: int(inc)})
	}
}

func (t *tracingTransport) record(ev memberEvent) {
	t.sink.mu.Lock()
	t.sink.events = append(t.sink.events, ev)
	t.sink.mu.Unlock()
}

// incarnationAndNode reads the fields Incarnation and Node of memberlist's
// suspect and alive messages: msgpack maps with the field names as keys
// (sorted), holding strings, byte strings, unsigned integers and arrays of
// them.
func incarnationAndNode(b []byte) (inc uint32, node string, ok bool) {
	if len(b) < 1 || b[0]&0xf0 != 0x80 {
		return 0, "", false
	}
	fields := int(b[0] & 0x0f)
	b = b[1:]
	var haveInc, haveNode bool
	for range fields {
		key, rest, ok := msgpackString(b)
		if !ok {
			return 0, "", false
		}
		b = rest
		switch key {
		case "Incarnation":
			var v uint64
			v, b, ok = msgpackUint(b)
			inc, haveInc = uint32(v), ok
		case "Node":
			node, b, ok = msgpackString(b)
			haveNode = ok
		default:
			b, ok = msgpackSkip(b)
		}
		if !ok {
			return 0, "", false
		}
	}
	return inc, node, haveInc && haveNode
}

func msgpackString(b []byte) (string, []byte, bool) {
	if len(b) < 1 {
		return "", nil, false
	}
	var l int
	switch c := b[0]; {
	case c&0xe0 == 0xa0:
		l, b = int(c&0x1f), b[1:]
	case (c == 0xd9 || c == 0xc4) && len(b) >= 2:
		l, b = int(b[1]), b[2:]
	case (c == 0xda || c == 0xc5) && len(b) >= 3:
		l, b = int(b[1])<<8|int(b[2]), b[3:]
	default:
		return "", nil, false
	}
	if len(b) < l {
		return "", nil, false
	}
	return string(b[:l]), b[l:], true
}

func msgpackUint(b []byte) (uint64, []byte, bool) {
	if len(b) < 1 {
		return 0, nil, false
	}
	size := map[byte]int{0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}[b[0]]
	if b[0] < 0x80 {
		return uint64(b[0]), b[1:], true
	}
	if size == 0 || len(b) < 1+size {
		return 0, nil, false
	}
	var v uint64
	for _, c := range b[1 : 1+size] {
		v = v<<8 | uint64(c)
	}
	return v, b[1+size:], true
}

// msgpackSkip skips one value of the kinds memberlist's messages hold.
func msgpackSkip(b []byte) ([]byte, bool) {
	if len(b) < 1 {
		return nil, false
	}
	switch c := b[0]; {
	case c == 0xc0 || c == 0xc2 || c == 0xc3:
		return b[1:], true
	case c < 0x80 || (c >= 0xcc && c <= 0xcf):
		_, rest, ok := msgpackUint(b)
		return rest, ok
	case c&0xf0 == 0x90:
		n := int(c & 0x0f)
		b = b[1:]
		for range n {
			var ok bool
			if b, ok = msgpackSkip(b); !ok {
				return nil, false
			}
		}
		return b, true
	default:
		_, rest, ok := msgpackString(b)
		return rest, ok
	}
}
