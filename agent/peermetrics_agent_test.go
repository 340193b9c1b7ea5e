package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// peerSeries reads c's agent's /metrics: the names its series of peer id
// carry (peer_name, "" for none), by family, and the labels of
// flotilla_cluster_info.
func peerSeries(t *testing.T, c *federation.Cluster, id string) (map[string][]string, map[string]string, error) {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(scrape(t, c)))
	if err != nil {
		return nil, nil, fmt.Errorf("parse %s's metrics: %w", c.Name, err)
	}
	named, info := map[string][]string{}, map[string]string{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if name == "flotilla_cluster_info" {
				info = labels
			}
			if labels["peer"] == id && !slices.Contains(named[name], labels["peer_name"]) {
				named[name] = append(named[name], labels["peer_name"])
			}
		}
	}
	return named, info, nil
}

// namedOnly checks that every series of the peer in named carries want as
// its name, in at least the families a connected peer has.
func namedOnly(named map[string][]string, want string) error {
	for _, f := range []string{"flotilla_peer_phase", "flotilla_peer_receive_bytes_total", "flotilla_tunnel_peer_last_handshake_timestamp_seconds", "flotilla_tunnel_peer_transmit_bytes_total"} {
		if _, ok := named[f]; !ok {
			return fmt.Errorf("no series of the peer in %s (families of it: %v)", f, named)
		}
	}
	for f, names := range named {
		if !slices.Equal(names, []string{want}) {
			return fmt.Errorf("%s names the peer %q, want only %q", f, names, want)
		}
	}
	return nil
}

// What a real agent's /metrics says of a peer: every series of it names
// it by the name it announced beside its ID, one series whatever the
// name, so that after b's agent comes back as b2 (same identity) a's
// series of b say b2 and none says b; the agent's own cluster is named by
// flotilla_cluster_info; once b is gone for good, none of a's series
// names it.
func TestPeerMetricsCarryThePeersName(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	harness.Require(t, harness.NeedsNetwork...)
	env := harness.New(t)
	cs := federation.New(t, env, federation.Options{PodCIDRs: []string{"10.244.0.0/16", "10.245.0.0/16"}})
	a, b := cs[0], cs[1]
	federation.Connect(t, cs)
	bID, aID := peerOf(t, a, b).Name, peerOf(t, b, a).Name

	waitUntil(t, "a's series of b name it b", func() error {
		named, info, err := peerSeries(t, a, bID)
		if err != nil {
			return err
		}
		if info["local_cluster"] != "a" || info["local_cluster_id"] != aID {
			return fmt.Errorf("flotilla_cluster_info %v, want local_cluster a, local_cluster_id %s", info, aID)
		}
		return namedOnly(named, "b")
	})

	if err := b.Agent.Stop(); err != nil {
		t.Fatalf("stop b's agent: %v", err)
	}
	i := slices.Index(b.Args, "--cluster-name")
	b.Args[i+1] = "b2"
	b.StartAgent(t)
	waitUntil(t, "a's series of b name it b2, and its Peer says b2", func() error {
		peers, err := a.Peers(context.Background())
		if err != nil {
			return err
		}
		if p, ok := peers["b2"]; !ok || p.Name != bID || p.Status.Phase != v1alpha1.PhaseConnected {
			return fmt.Errorf("a's Peers %v: want %s named b2, Connected", slices.Sorted(maps.Keys(peers)), bID)
		}
		named, _, err := peerSeries(t, a, bID)
		if err != nil {
			return err
		}
		return namedOnly(named, "b2")
	})

	if err := b.Agent.Stop(); err != nil {
		t.Fatalf("stop b's agent: %v", err)
	}
	eventually.Within(t, 2*time.Minute, "no series of b on a once it is gone for good", func() error {
		named, _, err := peerSeries(t, a, bID)
		if err != nil {
			return err
		}
		if len(named) > 0 {
			return errors.New(fmt.Sprint("series of b: ", named))
		}
		return nil
	})
}
