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
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
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

// hostedSeries reads c's agent's /metrics: the labels of every series of
// flotilla_hosted_endpoints_* in which id is the consumer or the third
// cluster, each as name=value joined by commas (ID labels left out).
func hostedSeries(t *testing.T, c *federation.Cluster, id string) ([]string, error) {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(scrape(t, c)))
	if err != nil {
		return nil, fmt.Errorf("parse %s's metrics: %w", c.Name, err)
	}
	var out []string
	for name, f := range families {
		if !strings.HasPrefix(name, "flotilla_hosted_endpoints_") {
			continue
		}
		for _, m := range f.GetMetric() {
			labels, of := []string{name}, false
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "consumer", "cluster":
					of = of || l.GetValue() == id
				default:
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
			}
			if of {
				out = append(out, strings.Join(labels, ","))
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// The series of endpoints on third clusters name their peers as every
// per-peer series does, on a real agent: b offloads a namespace to a,
// and a slice of endpoints on a third cluster, written in the namespace
// a mirrors for b, is translated in part; a's series say consumer_name b
// and cluster_name b beside the IDs; once b is gone for good, none of
// them is left.
func TestHostedEndpointsMetricsCarryThePeersNames(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	harness.Require(t, harness.NeedsNetwork...)
	env := harness.New(t)
	cs := federation.New(t, env, federation.Options{
		PodCIDRs: []string{"10.244.0.0/16", "10.245.0.0/16"},
		ArgsFor: func(i int, _ []*federation.Cluster) []string {
			if i == 0 {
				return []string{"--offload-grants=auto"}
			}
			return []string{"--offload-to=auto"}
		},
	})
	a, b := cs[0], cs[1]
	// The provider grants nothing before it proves deploy/'s policies
	// confine its agent: both run as deploy/'s account.
	for _, c := range cs {
		c.RunAsAgentAccount(t)
	}
	federation.Connect(t, cs)
	bID := peerOf(t, a, b).Name
	ctx := context.Background()

	eventually.Within(t, 2*time.Minute, "b's credential from a Ready", func() error {
		p := peerOf(t, b, a)
		if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionOffloadCredential); c == nil || c.Reason != "Ready" {
			return fmt.Errorf("condition %s: %+v", v1alpha1.ConditionOffloadCredential, c)
		}
		return nil
	})
	if _, err := b.CP.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Client.Create(ctx, &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "offload"},
		Spec: v1alpha1.NamespaceOffloadSpec{ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue}}}}); err != nil {
		t.Fatal(err)
	}
	var mirrored string
	eventually.Within(t, 2*time.Minute, "a namespace mirrored for b on a", func() error {
		list, err := a.CP.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: offload.MirroredSelector(bID).String()})
		if err != nil {
			return err
		}
		for _, ns := range list.Items {
			if ns.Labels[v1alpha1.LabelMirroredFrom] == "app" && ns.DeletionTimestamp == nil {
				mirrored = ns.Name
				return nil
			}
		}
		return fmt.Errorf("%d mirrored namespaces, none of app", len(list.Items))
	})

	// Two endpoints of b's: its pod, in a's view of b, and an address
	// outside every view a has of b.
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "api-third", Namespace: mirrored, Labels: map[string]string{
			offload.LabelReflected: "true", discoveryv1.LabelManagedBy: offload.ReflectionManagedBy,
			offload.LabelEndpointsOf: bID, offload.LabelServiceName: "api",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{b.Pod.Addr.String()}},
			{Addresses: []string{"192.0.2.1"}},
		},
	}
	if _, err := a.CP.Client.DiscoveryV1().EndpointSlices(mirrored).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"flotilla_hosted_endpoints_dropped_total,consumer_name=b,reason=untranslatable",
		"flotilla_hosted_endpoints_translated_total,cluster_name=b,consumer_name=b",
	}
	waitUntil(t, "a's series of endpoints on b, for b, name it b", func() error {
		got, err := hostedSeries(t, a, bID)
		if err != nil {
			return err
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("series %q, want %q", got, want)
		}
		return nil
	})

	if err := b.Agent.Stop(); err != nil {
		t.Fatalf("stop b's agent: %v", err)
	}
	eventually.Within(t, 2*time.Minute, "no series naming b on a once it is gone for good", func() error {
		// The witness: a's engine has forgotten b (its Peer object, with
		// the grant an administrator gave, stays).
		named, _, err := peerSeries(t, a, bID)
		if err != nil {
			return err
		}
		if len(named) > 0 {
			return fmt.Errorf("b not forgotten yet: series of it %v", named)
		}
		got, err := hostedSeries(t, a, bID)
		if err != nil {
			return err
		}
		if len(got) > 0 {
			return fmt.Errorf("series %q", got)
		}
		return nil
	})
}
