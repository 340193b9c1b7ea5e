package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// floodHeapLimit is the heap an agent may have in use while it is
// flooded: its memory request in deploy/deployment.yaml (the limit is
// twice that). Unbounded, the flood below makes memberlist buffer up to
// 2 MiB for each of 50 streams at once, on top of the agent's own heap.
const floodHeapLimit = 64 << 20

// A host on the LAN without the federation key opens 1000 gossip streams
// to agent a, each claiming 16 MiB of sealed state and sending 2 MiB:
// every one is refused or cut before memberlist decrypts it, a's heap
// in use stays under floodHeapLimit throughout, and a and b stay
// Connected, b alive in a's gossip.
func TestGossipFloodFromTheLANIsBounded(t *testing.T) {
	requireAll(t)
	env := harness.New(t)
	lan := env.NewLAN("lan")
	cs := federation.New(t, env, federation.Options{PodCIDRs: sameCIDR3[:2], LAN: lan})
	federation.Connect(t, cs)
	a := cs[0]
	stranger := env.NewSite("x", harness.SiteOptions{LAN: lan})

	const streams, sent, workers = 1000, 2 << 20, 50
	limited := func() (float64, error) {
		return agentMetric(a.Site, "flotilla_discovery_gossip_streams_limited_total")
	}
	before, err := limited()
	if err != nil {
		t.Fatal(err)
	}
	var peak atomic.Uint64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			if v, err := agentMetric(a.Site, "go_memstats_heap_inuse_bytes"); err == nil {
				peak.Store(max(peak.Load(), uint64(v)))
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})

	target := netip.AddrPortFrom(a.Site.Addr, 7946).String()
	header := make([]byte, 5)
	header[0] = 10 // memberlist's encryptMsg: what follows is sealed state
	binary.BigEndian.PutUint32(header[1:], 16<<20)
	junk := bytes.Repeat([]byte{0xa5}, 64<<10)
	var flood sync.WaitGroup
	work := make(chan struct{})
	var dialed atomic.Int64
	for range workers {
		flood.Go(func() {
			for range work {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				c, err := stranger.DialContext(ctx, "tcp", target)
				cancel()
				if errors.Is(err, syscall.ECONNRESET) {
					dialed.Add(1) // accepted, and reset by the gate before the dial returned
				}
				if err != nil {
					continue
				}
				dialed.Add(1)
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				if _, err := c.Write(header); err == nil {
					for n := 0; n < sent; n += len(junk) {
						if _, err := c.Write(junk); err != nil {
							break
						}
					}
				}
				_ = c.Close()
			}
		})
	}
	for range streams {
		work <- struct{}{}
	}
	close(work)
	flood.Wait()
	t.Logf("%d of %d streams reached the agent", dialed.Load(), streams)

	waitFor(t, a.Agent, 60*time.Second, func() error {
		now, err := limited()
		if err != nil {
			return err
		}
		if now-before < float64(dialed.Load()) {
			return fmt.Errorf("%v of the %d flood streams refused or cut", now-before, dialed.Load())
		}
		return nil
	})
	close(stop)
	sampler.Wait()
	for _, r := range []string{"busy", "source_busy", "source_rate", "oversized"} {
		v, _ := agentMetric(a.Site, "flotilla_discovery_gossip_streams_limited_total", "reason="+r)
		t.Logf("refused or cut, %s: %v", r, v)
	}
	if dialed.Load() != streams {
		t.Errorf("%d of %d flood streams reached the agent", dialed.Load(), streams)
	}
	if now, _ := limited(); now-before != streams {
		t.Errorf("%v streams refused or cut, want every one of the %d", now-before, streams)
	}
	t.Logf("a's heap in use peaked at %.1f MiB during the flood (limit %d MiB)", float64(peak.Load())/(1<<20), floodHeapLimit>>20)
	if peak.Load() == 0 || peak.Load() > floodHeapLimit {
		t.Errorf("a's heap in use peaked at %d MiB during the flood, limit %d MiB", peak.Load()>>20, floodHeapLimit>>20)
	}

	federation.WaitPhases(t, cs, v1alpha1.PhaseConnected, 30*time.Second)
	waitFor(t, a.Agent, 30*time.Second, func() error {
		alive, err := agentMetric(a.Site, "flotilla_discovery_members", "state=alive")
		if err != nil {
			return err
		}
		if alive != 1 {
			return fmt.Errorf("a has %v alive members, want b", alive)
		}
		return nil
	})
}

// agentMetric is the sum of the series of metric name on the agent in
// site s whose labels include labels ("k=v").
func agentMetric(s *harness.Site, name string, labels ...string) (float64, error) {
	body, err := getIn(s, "http://127.0.0.1:9470/metrics")
	if err != nil {
		return 0, err
	}
	var sum float64
	found := false
line:
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			if !strings.Contains(line, k+`="`+v+`"`) {
				continue line
			}
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, fmt.Errorf("no %s %v on the agent's /metrics", name, labels)
	}
	return sum, nil
}
