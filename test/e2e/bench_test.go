package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// From starting every agent of a LAN federation (fresh identities, control
// planes already up) to the first TCP connection crossing between pods of
// every pair, by their views. Run with -benchtime 5x for a median of 5.
//
// Anchor: Liqo v0.8 peering took 3.81 s +- 0.78 s; target <= 1 s for 2.
func BenchmarkPeeringFirstPacket(b *testing.B) {
	for _, n := range []int{2, 3, 5} {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) { benchFirstPacket(b, n) })
	}
}

func benchFirstPacket(b *testing.B, n int) {
	requireAll(b)
	env := harness.New(b)
	cidrs := make([]string, n)
	for i := range cidrs {
		cidrs[i] = "10.0.0.0/16"
	}
	cs := federation.New(b, env, federation.Options{PodCIDRs: cidrs, Args: []string{"--log-level", "info"}})
	var samples []time.Duration
	for i := 0; b.Loop(); i++ {
		reset(b, cs, i)
		start := time.Now()
		for _, c := range cs {
			c.StartAgent(b)
		}
		var wg sync.WaitGroup
		errs := make(chan error, n*n)
		for _, from := range cs {
			for _, to := range cs {
				if from != to {
					wg.Add(1)
					go func() { defer wg.Done(); errs <- firstConnection(from, to, 60*time.Second) }()
				}
			}
		}
		wg.Wait()
		samples = append(samples, time.Since(start))
		close(errs)
		for err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	slices.Sort(samples)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(samples[len(samples)/2]), "ms-median")
	b.ReportMetric(ms(samples[0]), "ms-min")
	b.ReportMetric(ms(samples[len(samples)-1]), "ms-max")
	b.ReportMetric(0, "ns/op")
}

// reset stops the agents and removes everything they made, so the next
// round starts from nothing: no data path, no Peers, new identities.
func reset(b *testing.B, cs []*federation.Cluster, round int) {
	b.Helper()
	for _, c := range cs {
		if c.Agent == nil {
			continue // the first round: nothing to undo
		}
		c.Agent.Stop()
		c.Site.MustExec(c.Bin, "cleanup", "--wireguard-interface", c.Interface())
		os.RemoveAll(c.StateDir)
		if err := c.Client.DeleteAllOf(context.Background(), &v1alpha1.Peer{}); err != nil {
			b.Fatal(err)
		}
		for j, a := range c.Args {
			if a == "--state-dir" {
				c.StateDir = fmt.Sprintf("%s-%d", c.StateDir, round)
				c.Args[j+1] = c.StateDir
			}
		}
	}
}

// firstConnection waits until from's pod completes a TCP connection to
// to's pod, by from's view of it.
func firstConnection(from, to *federation.Cluster, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		dst, ok := view(from, to)
		if ok {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			conn, err := from.Pod.DialContext(ctx, "tcp", netip.AddrPortFrom(dst, federation.PodPort).String())
			cancel()
			if err == nil {
				conn.Close()
				return nil
			}
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
	return fmt.Errorf("%s never reached %s's pod within %s", from.Name, to.Name, timeout)
}

// view reads from's view of to's pod from from's Peer of to, once it has
// one.
func view(from, to *federation.Cluster) (netip.Addr, bool) {
	var list v1alpha1.PeerList
	if err := from.Client.List(context.Background(), &list, client.MatchingLabels{v1alpha1.LabelClusterName: to.Name}); err != nil || len(list.Items) != 1 {
		return netip.Addr{}, false
	}
	for _, v := range list.Items[0].Status.TheirNetworks {
		real, err1 := netip.ParsePrefix(v.Range)
		as, err2 := netip.ParsePrefix(v.As)
		if err1 == nil && err2 == nil && real.Contains(to.Pod.Addr) {
			return federation.Translate(to.Pod.Addr, real, as), true
		}
	}
	return netip.Addr{}, false
}
