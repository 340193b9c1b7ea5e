package e2e

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// TestMain lets the test binary play "mallory", a member of the federation
// that misbehaves, as a real process inside a site (see runMallory), and
// "swarm", many well-behaved members without Kubernetes (see runSwarm).
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == "swarm" {
		if err := runSwarm(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "swarm:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) == 3 && os.Args[1] == "mallory" {
		if err := runMallory(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "mallory:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type malloryConfig struct {
	Token     string
	Advertise netip.Addr
	A, B      netip.Addr // gossip addresses (port 7946) of the victims
}

// A member of the federation holds the gossip key, so only signatures and
// generations stand between it and the other clusters' data paths. Mallory
// joins honestly, then replays her own older statement and forges one in
// b's name denying networking; a accepts her newer statement, refuses
// both, and a and b stay connected.
func TestPeeringRefusesReplayAndForgeryFromAMember(t *testing.T) {
	requireAll(t)
	env := harness.New(t)
	cs := federation.New(t, env, federation.Options{PodCIDRs: sameCIDR3})
	a, b, m := cs[0], cs[1], cs[2]
	federation.Connect(t, cs[:2])

	token := a.Args[indexOf(a.Args, "--federation-key")+1]
	cfg, _ := json.Marshal(malloryConfig{Token: token, Advertise: m.Site.Addr, A: a.Site.Addr, B: b.Site.Addr})
	mallory := m.Site.Start("mallory", os.Args[0], "mallory", string(cfg))
	select {
	case <-mallory.Done():
	case <-time.After(90 * time.Second):
		t.Fatalf("mallory did not finish:\n%s", mallory.Tail(20))
	}
	if _, err := mallory.Exited(); err != nil {
		t.Fatalf("mallory failed: %v\n%s", err, mallory.Tail(20))
	}
	report := mallory.Log()
	gens := regexp.MustCompile(`generations (\d+) (\d+) id (c[a-z2-7]+)`).FindStringSubmatch(report)
	if gens == nil {
		t.Fatalf("mallory's report lacks her generations:\n%s", report)
	}
	newer, _ := strconv.ParseInt(gens[2], 10, 64)

	// a took mallory's newer statement and kept it over the replayed one.
	var p v1alpha1.Peer
	deadline := time.Now().Add(30 * time.Second)
	for {
		peers, err := a.Peers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		p = peers["mallory-2"]
		if p.Name == gens[3] && p.Status.StatementGeneration == newer {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a's Peer of mallory: %+v, want name mallory-2 with generation %d", p.Status, newer)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Both refusals are counted by a: the witness that a has processed the
	// replay and the forgery before their absence is checked.
	for _, reason := range []string{"replayed", "forged"} {
		waitFor(t, a.Agent, 30*time.Second, func() error {
			return metricAtLeast(a.Site, `flotilla_peering_messages_refused_total{reason="`+reason+`"}`, 1)
		})
	}
	if _, ok := mustPeers(t, a)["mallory"]; ok {
		t.Error("the replayed statement brought back mallory's old name")
	}
	// The forged deny changed nothing between a and b.
	federation.WaitPhases(t, cs[:2], v1alpha1.PhaseConnected, 5*time.Second)
	federation.AllPairsTalk(t, cs[:2])
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func mustPeers(t *testing.T, c *federation.Cluster) map[string]v1alpha1.Peer {
	t.Helper()
	peers, err := c.Peers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return peers
}

// runMallory joins the federation, waits for a and b, and sends a: her
// statement (generation g1, name "mallory"), a newer one (g2, name
// "mallory-2"), g1 again (a replay), and a statement claiming to come from
// b that denies networking, signed with her own key (a forgery).
func runMallory(raw string) error {
	var cfg malloryConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return err
	}
	tok, err := discovery.ParseFederationKey(cfg.Token)
	if err != nil {
		return err
	}
	id, err := identity.Generate()
	if err != nil {
		return err
	}
	d, err := discovery.New(discovery.Config{
		Identity: id, Keys: [][]byte{tok.Key}, Protocol: peering.ProtocolVersion,
		BindAddr:      netip.AddrPortFrom(netip.IPv4Unspecified(), 7946),
		AdvertiseAddr: netip.AddrPortFrom(cfg.Advertise, 7946),
		Seeds:         []string{netip.AddrPortFrom(cfg.A, 7946).String()},
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := d.Start(ctx); err != nil {
		return err
	}
	defer d.Close()
	ids := map[netip.Addr]string{}
	for ev := range d.Subscribe(ctx) {
		if ev.Kind == discovery.Join {
			ids[ev.Member.Gossip.Addr()] = ev.Member.ClusterID
		}
		if ids[cfg.A] != "" && ids[cfg.B] != "" {
			break
		}
	}
	if ids[cfg.A] == "" || ids[cfg.B] == "" {
		return fmt.Errorf("a and b never became members: %v", ids)
	}
	wgKey := make([]byte, 32)
	rand.Read(wgKey)
	hello := func(from string, gen uint64, name string, decision peering.Decision) *peering.Hello {
		return &peering.Hello{
			Protocol: peering.ProtocolVersion, From: from, To: ids[cfg.A], Generation: gen, Name: name,
			Networks: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}, WireGuardKey: wgKey,
			Endpoint: netip.AddrPortFrom(cfg.Advertise, 51820), Decision: decision,
		}
	}
	g1 := uint64(time.Now().UnixNano())
	g2 := g1 + 1
	first, err := peering.Seal(hello(id.ClusterID(), g1, "mallory", peering.Pending), id)
	if err != nil {
		return err
	}
	second, err := peering.Seal(hello(id.ClusterID(), g2, "mallory-2", peering.Pending), id)
	if err != nil {
		return err
	}
	// A forgery: b's name, mallory's signature. Seal refuses to sign for
	// another identity, so the envelope is built by hand.
	forged := hello(ids[cfg.B], g2+1, "b", peering.Deny)
	payload, err := json.Marshal(forged)
	if err != nil {
		return err
	}
	forgedMsg := append([]byte{'F', 'L', 'P', 1, byte(len(payload) >> 24), byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload))}, payload...)
	forgedMsg = append(forgedMsg, id.Sign(payload)...)
	for _, step := range []struct {
		what string
		msg  []byte
	}{{"g1", first}, {"g2", second}, {"replay of g1", first}, {"forgery as b", forgedMsg}} {
		if err := d.Send(ctx, ids[cfg.A], step.msg); err != nil {
			return fmt.Errorf("send %s: %w", step.what, err)
		}
		time.Sleep(300 * time.Millisecond) // in order, each processed alone
	}
	fmt.Printf("generations %d %d id %s\n", g1, g2, id.ClusterID())
	return nil
}

// getIn fetches url from inside the site.
func getIn(s *harness.Site, url string) (string, error) {
	resp, err := siteClient(s).Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
