package main

import (
	"bufio"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// lines is a writer of whole lines, safe for one writer at a time.
type lines struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// The probe's tries overlap, and an answer is timed when it came: a try
// stuck in a gap does not hold back the ones after it. The echo server
// here holds every connection accepted in a window of 300 ms for 2 s
// before it answers, as a path whose SYNs are lost and sent again would;
// the tries that started after the window are answered at once, so the
// longest time between two answers is close to the window, not to the
// 2 s a stuck try waits.
func TestProbeTriesOverlap(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	const windowFrom, window, stuck = 400 * time.Millisecond, 300 * time.Millisecond, 2 * time.Second
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if since := time.Since(start); since >= windowFrom && since < windowFrom+window {
					time.Sleep(stuck)
				}
				if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
					c.Write([]byte("127.0.0.1 echo uid-1\n"))
				}
			}()
		}
	}()
	var out lines
	if code := probeEcho(&out, l.Addr().String(), 10*time.Millisecond, 3*time.Second, 1500*time.Millisecond); code != 0 {
		t.Fatalf("probe exited %d", code)
	}
	var answers []time.Time
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		f := strings.Fields(line)
		if len(f) != 6 || f[0] != "ok" || strings.Join(f[3:], " ") != "127.0.0.1 echo uid-1" {
			t.Fatalf("line %q, want ok <ns> <ns> 127.0.0.1 echo uid-1", line)
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		started, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if started > ns {
			t.Fatalf("line %q: the try started after its answer came", line)
		}
		answers = append(answers, time.Unix(0, ns))
	}
	// The stuck tries are answered 2 s after they started, after the
	// others: each line's time is its answer's. Gaps are looked for
	// while tries were still starting.
	var longest time.Duration
	var stuckAnswers int
	last := answers[0]
	for _, at := range answers[1:] {
		if at.Sub(start) > windowFrom+stuck {
			stuckAnswers++
			continue
		}
		if at.Before(last) {
			t.Fatalf("an answer at %s printed after one at %s", at.Sub(start), last.Sub(start))
		}
		longest = max(longest, at.Sub(last))
		last = at
	}
	if stuckAnswers == 0 {
		t.Errorf("no try was held in the window: the test tried nothing")
	}
	if longest < window/2 || longest >= stuck*3/4 {
		t.Errorf("longest time between answers %s: want about the %s window, and well under the %s a stuck try waited", longest, window, stuck)
	}
	t.Logf("%d answers, %d of tries held in the window; longest time between two %s (window %s)", len(answers), stuckAnswers, longest, window)
}
