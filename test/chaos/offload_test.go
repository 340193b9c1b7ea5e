package chaos_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The campaign's offloaded workload: in each pair, a Deployment of the
// consumer in a namespace offloaded (pods Remote) to its provider alone.
const (
	offloadNS    = "chaos-work"
	workloadName = "work"
	// workReplicas is the workload's size at rest; kill-mid-offload
	// scales it to workScaled and back.
	workReplicas = 3
	workScaled   = 8
)

// pair is one consumer offloading to one provider, and the replicas its
// workload asks for now.
type pair struct {
	cons, prov *federation.Cluster
	replicas   int32
}

// offloadPairs pairs the clusters two by two, the first of each the
// consumer: cs[0] offloads to cs[1], cs[2] to cs[3]; a cluster left over
// is in no pair (it still takes part in kill-mid-grant's spare grants).
func offloadPairs(cs []*federation.Cluster) []*pair {
	var ps []*pair
	for i := 0; i+1 < len(cs); i += 2 {
		ps = append(ps, &pair{cons: cs[i], prov: cs[i+1], replicas: workReplicas})
	}
	return ps
}

// prepareOffload readies the control planes before the agents start:
// every cluster uses every grant it receives (--offload-to=auto) and
// grants every peer (--offload-grants=auto: a consumer back
// under a new identity is granted again, and kill-mid-grant leaves no
// admin's decision in a Peer's spec, which would keep the Peer of a
// cluster's old identity for ever) and its agent runs as deploy/'s
// account, with its RBAC and admission policies (a provider grants
// nothing before it proves the policies confine it);
// the providers run a scheduler and a stand-in kubelet; the consumers
// run a scheduler and let their API server call the agent's placement
// webhook in its site.
func prepareOffload(t *testing.T, cs []*federation.Cluster, ps []*pair) {
	t.Helper()
	for _, c := range cs {
		c.Args = append(c.Args, "--offload-to=auto", "--offload-grants=auto")
		c.RunAsAgentAccount(t)
	}
	for _, p := range ps {
		// Addresses of the provider's pod network, clear of its site's pod.
		base := federation.Translate(netip.MustParseAddr("0.0.200.0"), netip.MustParsePrefix("0.0.0.0/0"), p.prov.Site.PodCIDR)
		p.prov.CP.StartScheduler()
		p.prov.CP.StartKubelet("chaos-node", harness.KubeletOptions{PodCIDR: netip.PrefixFrom(base, 24)})
		p.cons.CP.ReachInto(p.cons.Site.Netns, netip.PrefixFrom(p.cons.Site.Addr, 32))
		p.cons.CP.StartScheduler()
	}
}

// labelPair is the label the consumer's admin puts on the Peer of its
// provider, which its NamespaceOffload selects; the value is the
// provider's name.
const labelPair = "chaos.flotilla.io/provider"

// adoptProviders stands in for each consumer's admin until t ends: the
// Peer of its provider, whatever identity it comes back under, gets
// labelPair (selection never reads a name the peer gives itself).
func adoptProviders(t *testing.T, ps []*pair) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for _, p := range ps {
				peers, err := p.cons.Peers(ctx)
				if err != nil {
					continue
				}
				peer, ok := peers[p.prov.Name]
				if !ok || peer.Labels[labelPair] == p.prov.Name {
					continue
				}
				patch := client.RawPatch("application/merge-patch+json", fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, labelPair, p.prov.Name))
				_ = p.cons.Client.Patch(ctx, &peer, patch) // again next round if it failed
			}
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
}

// startWorkloads offloads offloadNS of each consumer to its provider (by
// the admin's label of its Peer: the provider may come back under a new
// identity) and creates the workload there, once the namespace is Ready
// there.
func startWorkloads(t *testing.T, ps []*pair) {
	t.Helper()
	ctx := context.Background()
	adoptProviders(t, ps)
	for _, p := range ps {
		waitCredential(t, p.cons, p.prov, 2*time.Minute)
		// Labelled into the placement webhook as the administrator's
		// `flotilla offload namespace` labels it: the agent may not.
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: offloadNS, Labels: map[string]string{offload.LabelOffloaded: "true"}}}
		if _, err := p.cons.CP.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: create namespace %s: %v", p.cons.Name, offloadNS, err)
		}
		nso := &v1alpha1.NamespaceOffload{
			ObjectMeta: metav1.ObjectMeta{Namespace: offloadNS, Name: "offload"},
			Spec: v1alpha1.NamespaceOffloadSpec{
				PodOffloading:   v1alpha1.PodsRemote,
				ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{labelPair: p.prov.Name}},
			},
		}
		if err := p.cons.Client.Create(ctx, nso); err != nil {
			t.Fatalf("%s: create the NamespaceOffload: %v", p.cons.Name, err)
		}
	}
	for _, p := range ps {
		waitOffloadReady(t, p, 2*time.Minute)
		labels := map[string]string{"app": workloadName}
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: offloadNS, Name: workloadName},
			Spec: appsv1.DeploymentSpec{
				Replicas: &p.replicas,
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					// No container runs: the provider's kubelet is a
					// stand-in. Placement comes from the agent's webhook.
					Spec: *harness.Restricted(&corev1.PodSpec{
						TerminationGracePeriodSeconds: new(int64),
						Containers:                    []corev1.Container{{Name: "app", Image: "registry.example/app:1"}},
					}),
				},
			},
		}
		if _, err := p.cons.CP.Client.AppsV1().Deployments(offloadNS).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: create Deployment %s: %v", p.cons.Name, workloadName, err)
		}
	}
}

// waitOffloadReady waits until p's NamespaceOffload is Ready.
func waitOffloadReady(t *testing.T, p *pair, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var got v1alpha1.NamespaceOffload
		err := p.cons.Client.Get(context.Background(), client.ObjectKey{Namespace: offloadNS, Name: "offload"}, &got)
		if err == nil && got.Status.Phase == v1alpha1.OffloadReady {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: namespace %s offloaded to %s not Ready after %s: %v %+v", p.cons.Name, offloadNS, p.prov.Name, within, err, got.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// credentialReason is the reason of cons's OffloadCredential condition
// for prov ("" without a Peer or a condition).
func credentialReason(cons, prov *federation.Cluster) (string, error) {
	peers, err := cons.Peers(context.Background())
	if err != nil {
		return "", err
	}
	p, ok := peers[prov.Name]
	if !ok {
		return "", nil
	}
	c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionOffloadCredential)
	if c == nil {
		return "", nil
	}
	return c.Reason, nil
}

// credentialWithin waits until cons holds a Ready credential from prov.
func credentialWithin(cons, prov *federation.Cluster, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		r, err := credentialReason(cons, prov)
		if err == nil && r == "Ready" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s's credential from %s: reason %q (%v) after %s", cons.Name, prov.Name, r, err, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitCredential(t *testing.T, cons, prov *federation.Cluster, within time.Duration) {
	t.Helper()
	if err := credentialWithin(cons, prov, within); err != nil {
		t.Fatal(err)
	}
}
