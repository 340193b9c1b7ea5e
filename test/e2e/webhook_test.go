package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// agentMemoryLimit is the agent container's memory limit in
// deploy/deployment.yaml.
const agentMemoryLimit = 128 << 20

// webhookClientCAWarning is what an agent run with
// --webhook-client-ca=none logs at start.
const webhookClientCAWarning = "placement webhook answers any client (--webhook-client-ca=none)"

// An agent run with --webhook-client-ca=none, the opt-out for a managed
// control plane whose API server cannot present a client certificate:
// it warns in its log (an agent with the default does not), its
// placement webhook still admits a's pods onto b's virtual node, and a
// host on the LAN, which the webhook now answers, sends it 1000 reviews
// announced as 8 MiB each and 50 of 8 MiB unannounced (chunked): every
// one is refused unread (413 announced too large, 411 of unknown
// length), less than the webhook's 4 MiB cap of each sent, the agent's
// container stays under its memory limit without a restart, a's pods are
// still admitted, and a and b stay Connected.
func TestPlacementWebhookWithoutClientCertificates(t *testing.T) {
	longRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	env := harness.New(t)
	cs := federation.OnNodes(t, env, federation.NodeOptions{
		Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"),
		ArgsFor: func(i int) []string {
			if i == 1 {
				return []string{"--offload-grants=auto", "--cluster-label=region=b"}
			}
			// The loopback trusted, for the agent's heap on /metrics.
			return []string{"--webhook-client-ca=none", "--metrics-trust-loopback"}
		},
	})
	a, b := cs[0], cs[1]
	federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
	acceptOffloading(t, a, b.Name, "region")
	waitCondition(t, a, b.Name, v1alpha1.ConditionOffloadCredential, "Ready", 90*time.Second)
	bID := peerID(t, a, b.Name)
	createNamespace(t, a, "shop")
	offloadNamespace(t, a, "shop", "--selector", "region=b", "--pods", "Remote")

	t.Run("the agent warns and still admits pods", func(t *testing.T) {
		// Placed by the webhook: without its toleration no pod would
		// go to the tainted virtual node.
		federation.CreateDeployment(t, a, "shop", "web", 1, nil)
		waitPods(t, a, "shop", "app=web", 1, 120*time.Second, runningOn(offload.VirtualNodeName(bID)))
		for _, c := range []struct {
			cluster *federation.NodeCluster
			warns   bool
		}{{a, true}, {b, false}} {
			logs := agentLogs(t, c.cluster)
			if got := strings.Contains(logs, webhookClientCAWarning); got != c.warns {
				t.Errorf("%s's agent logged %q: %v, want %v", c.cluster.Name, webhookClientCAWarning, got, c.warns)
			}
		}
	})

	t.Run("a flood of large reviews from the LAN is refused within the memory limit", func(t *testing.T) {
		agent := agentContainerOf(t, a)
		stranger := env.NewSite("x", harness.SiteOptions{LAN: a.LAN()})
		url := "https://" + netip.AddrPortFrom(a.Gateway.Addr, 9443).String() + "/placement"
		// A connection of its own per review (HTTP/2, as the API
		// server speaks to webhooks, so that an answer given before the
		// body is read arrives whole); a stranger: no client
		// certificate, and it does not care whose the server's is.
		newClient := func() *http.Client {
			return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
				DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
					return stranger.DialContext(ctx, network, addr)
				},
				TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
				ForceAttemptHTTP2: true,
			}}
		}
		workingSet := func() (uint64, error) {
			m, err := agent.cgroup.Read()
			return m.WorkingSet(), err
		}
		gateway := &harness.Site{Netns: a.Gateway.Netns}
		heap := func() (uint64, error) {
			v, err := agentMetric(gateway, "go_memstats_heap_inuse_bytes")
			return uint64(v), err
		}
		ws0, err := workingSet()
		if err != nil {
			t.Fatal(err)
		}
		heap0, err := heap()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("before the floods: a's agent container's working set %.1f MiB, heap in use %.1f MiB", float64(ws0)/(1<<20), float64(heap0)/(1<<20))
		peak := harness.SamplePeak(50*time.Millisecond, workingSet)
		peakHeap := harness.SamplePeak(100*time.Millisecond, heap)
		// readCap is the most the webhook reads of a review: a review of
		// which the client sent that much was read.
		const size, readCap = 8 << 20, 4 << 20
		post := func(announced bool) (int, int64) {
			body := &countingBody{left: size}
			req, err := http.NewRequest(http.MethodPost, url, body)
			if err != nil {
				t.Error(err)
				return 0, 0
			}
			req.Header.Set("Content-Type", "application/json")
			if announced {
				req.ContentLength = size
			} else {
				req.ContentLength = -1 // chunked
			}
			client := newClient()
			defer client.CloseIdleConnections()
			resp, err := client.Do(req)
			if err != nil {
				return 0, body.read.Load()
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			return resp.StatusCode, body.read.Load()
		}
		for _, round := range []struct {
			what      string
			requests  int
			announced bool
			allowed   []int
		}{
			{"announced as 8 MiB", 1000, true, []int{http.StatusRequestEntityTooLarge}},
			{"8 MiB unannounced", 50, false, []int{http.StatusLengthRequired}},
		} {
			var codes [600]atomic.Int64
			var read, failed atomic.Int64
			harness.Flood(round.requests, 50, func() {
				code, sent := post(round.announced)
				if code <= 0 || code >= len(codes) {
					failed.Add(1)
				} else {
					codes[code].Add(1)
				}
				if sent >= readCap {
					read.Add(1)
				}
			})
			var got []string
			refused := int64(0)
			for code := range codes {
				if n := codes[code].Load(); n > 0 {
					got = append(got, fmt.Sprintf("%d: %d", code, n))
					for _, ok := range round.allowed {
						if code == ok {
							refused += n
						}
					}
				}
			}
			t.Logf("%d reviews %s: %s; %d without an answer", round.requests, round.what, strings.Join(got, ", "), failed.Load())
			// A sender still writing its body when the refusal closes the
			// connection may see the reset before the answer: a few such
			// are the race of refusing early, not an admission; every
			// answer must be a refusal.
			if answered := int64(round.requests) - failed.Load(); refused != answered || failed.Load() > int64(round.requests)/100 {
				t.Errorf("%d of %d reviews %s refused with %v, %d without an answer (at most 1%% may have none)", refused, round.requests, round.what, round.allowed, failed.Load())
			}
			if n := read.Load(); n != 0 {
				t.Errorf("%d of %d reviews %s had %d MiB or more of their body read", n, round.requests, round.what, readCap>>20)
			}
		}
		peakSet, peakInUse := peak.Stop(), peakHeap.Stop()
		// The heap is reported, not bounded here: with GOMEMLIMIT at the
		// container's limit the collector lets garbage grow toward it.
		// What the webhook buffers is bounded in offload/placement
		// (TestPlacementWebhookBuffersLittleOfWaitingReviews).
		t.Logf("a's agent during the floods: heap in use peaked at %.1f MiB, the container's working set at %.1f MiB (limit %d MiB)",
			float64(peakInUse)/(1<<20), float64(peakSet)/(1<<20), agentMemoryLimit>>20)
		if peakSet == 0 || peakSet >= agentMemoryLimit {
			t.Errorf("a's agent container's working set peaked at %d MiB, its limit is %d MiB", peakSet>>20, agentMemoryLimit>>20)
		}
		agent.checkSame(t)
		// Still admitting, and still peered.
		federation.CreateDeployment(t, a, "shop", "after", 1, nil)
		waitPods(t, a, "shop", "app=after", 1, 120*time.Second, runningOn(offload.VirtualNodeName(bID)))
		federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 30*time.Second)
	})
}

// agentLogs is the log of c's agent pod.
func agentLogs(t *testing.T, c *federation.NodeCluster) string {
	t.Helper()
	pod, err := c.AgentPod(context.Background())
	if err != nil {
		t.Fatalf("agent pod of %s: %v", c.Name, err)
	}
	out, err := federation.KubectlTimeout(c.CP, 60*time.Second, "-n", pod.Namespace, "logs", pod.Name)
	if err != nil {
		t.Fatalf("logs of %s's agent: %v", c.Name, err)
	}
	return out
}

// countingBody is a request body of left bytes that counts what was read
// of it.
type countingBody struct {
	left int64
	read atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	n := int64(len(p))
	if n > b.left {
		n = b.left
	}
	for i := range p[:n] {
		p[i] = ' '
	}
	b.left -= n
	b.read.Add(n)
	return int(n), nil
}
