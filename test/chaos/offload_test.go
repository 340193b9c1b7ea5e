package chaos_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
// every cluster grants every peer (--offload-grants=auto: a consumer back
// under a new identity is granted again, and kill-mid-grant leaves no
// admin's decision in a Peer's spec, which would keep the Peer of a
// cluster's old identity for ever) and has the consumer's ClusterRole;
// the providers run a scheduler and a stand-in kubelet; the consumers
// run a scheduler and let their API server call the agent's placement
// webhook in its site.
func prepareOffload(t *testing.T, cs []*federation.Cluster, ps []*pair) {
	t.Helper()
	for _, c := range cs {
		c.Args = append(c.Args, "--offload-grants=auto")
		if out, err := federation.Kubectl(c.CP, "apply", "--server-side", "-f", "../../deploy/namespace.yaml", "-f", "../../deploy/rbac.yaml"); err != nil {
			t.Fatalf("%s: %v\n%s", c.Name, err, out)
		}
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

// startWorkloads offloads offloadNS of each consumer to its provider (by
// its name: the provider may come back under a new identity) and creates
// the workload there, once the namespace is Ready there.
func startWorkloads(t *testing.T, ps []*pair) {
	t.Helper()
	ctx := context.Background()
	for _, p := range ps {
		waitCredential(t, p.cons, p.prov, 2*time.Minute)
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: offloadNS}}
		if _, err := p.cons.CP.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: create namespace %s: %v", p.cons.Name, offloadNS, err)
		}
		nso := &v1alpha1.NamespaceOffload{
			ObjectMeta: metav1.ObjectMeta{Namespace: offloadNS, Name: "offload"},
			Spec: v1alpha1.NamespaceOffloadSpec{
				PodOffloading:   v1alpha1.PodsRemote,
				ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelClusterName: p.prov.Name}},
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
					Spec: corev1.PodSpec{
						TerminationGracePeriodSeconds: new(int64),
						Containers:                    []corev1.Container{{Name: "app", Image: "registry.example/app:1"}},
					},
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

// remotePod is a pod a consumer made on a provider, by what its origin
// annotation and its namespace's tenant label say.
type remotePod struct {
	on       *federation.Cluster
	ns, name string
	consumer string // the consumer's cluster ID
	origin   string // "<namespace>/<name>/<uid>" of the consumer's pod
}

// remotePods lists the pods of c that carry an origin, in namespaces
// mirrored for a consumer.
func remotePods(c *federation.Cluster) ([]remotePod, error) {
	ctx := context.Background()
	nss, err := c.CP.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: offload.LabelTenant})
	if err != nil {
		return nil, err
	}
	tenant := map[string]string{}
	for _, ns := range nss.Items {
		tenant[ns.Name] = ns.Labels[offload.LabelTenant]
	}
	pods, err := c.CP.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []remotePod
	for _, p := range pods.Items {
		origin, ok := p.Annotations[offload.AnnotationOrigin]
		if !ok {
			continue
		}
		out = append(out, remotePod{on: c, ns: p.Namespace, name: p.Name, consumer: tenant[p.Namespace], origin: origin})
	}
	return out, nil
}

// offloadProblems is what breaks "no offloaded pod duplicated or lost"
// now, one line each: every pair's consumer has the replicas its
// workload asks for, each Running on its provider's virtual node (by the
// provider's current identity); each consumer pod on a virtual node has
// exactly one pod with its origin on that provider and none elsewhere;
// no pod with an origin stands for a consumer pod that is gone, or for a
// consumer identity that no longer exists.
func offloadProblems(cs []*federation.Cluster, ps []*pair, ids map[string]*federation.Cluster) ([]string, error) {
	ctx := context.Background()
	idOf := map[*federation.Cluster]string{}
	for id, c := range ids {
		idOf[c] = id
	}
	// held[consumer][origin] are the pods standing for one consumer pod.
	held := map[*federation.Cluster]map[string][]remotePod{}
	var problems []string
	for _, c := range cs {
		rps, err := remotePods(c)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Name, err)
		}
		for _, rp := range rps {
			cons, ok := ids[rp.consumer]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: pod %s/%s stands for %s of %q, no current member", c.Name, rp.ns, rp.name, rp.origin, rp.consumer))
				continue
			}
			if held[cons] == nil {
				held[cons] = map[string][]remotePod{}
			}
			held[cons][rp.origin] = append(held[cons][rp.origin], rp)
		}
	}
	for _, c := range cs {
		pods, err := c.CP.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Name, err)
		}
		p := consumerPair(ps, c)
		live := 0
		for _, pod := range pods.Items {
			origin := pod.Namespace + "/" + pod.Name + "/" + string(pod.UID)
			remote := held[c][origin]
			delete(held[c], origin)
			if !strings.HasPrefix(pod.Spec.NodeName, offload.VirtualNodePrefix) {
				for _, rp := range remote {
					problems = append(problems, fmt.Sprintf("%s: pod %s/%s stands for %s's %s, on no virtual node (%q)", rp.on.Name, rp.ns, rp.name, c.Name, origin, pod.Spec.NodeName))
				}
				continue
			}
			provID := strings.TrimPrefix(pod.Spec.NodeName, offload.VirtualNodePrefix)
			prov := ids[provID]
			var on []string
			for _, rp := range remote {
				on = append(on, rp.on.Name)
			}
			switch {
			case prov == nil:
				problems = append(problems, fmt.Sprintf("%s: pod %s/%s bound to %s, of no current member", c.Name, pod.Namespace, pod.Name, pod.Spec.NodeName))
			case len(remote) != 1 || remote[0].on != prov:
				problems = append(problems, fmt.Sprintf("%s: pod %s/%s on %s's virtual node is on %v, want on %s alone", c.Name, pod.Namespace, pod.Name, prov.Name, on, prov.Name))
			}
			if p != nil && pod.Namespace == offloadNS && pod.DeletionTimestamp == nil {
				live++
				if prov != p.prov || pod.Status.Phase != corev1.PodRunning {
					problems = append(problems, fmt.Sprintf("%s: pod %s/%s %s on %s, want Running on %s's", c.Name, pod.Namespace, pod.Name, pod.Status.Phase, pod.Spec.NodeName, p.prov.Name))
				}
			}
		}
		for origin, remote := range held[c] {
			for _, rp := range remote {
				problems = append(problems, fmt.Sprintf("%s: pod %s/%s stands for %s's %s, which is gone", rp.on.Name, rp.ns, rp.name, c.Name, origin))
			}
		}
		if p != nil && live != int(p.replicas) {
			problems = append(problems, fmt.Sprintf("%s: %d pods of %s/%s offloaded to %s, want %d", c.Name, live, offloadNS, workloadName, p.prov.Name, p.replicas))
		}
	}
	return problems, nil
}

// consumerPair is the pair c is the consumer of, or nil.
func consumerPair(ps []*pair, c *federation.Cluster) *pair {
	if i := slices.IndexFunc(ps, func(p *pair) bool { return p.cons == c }); i >= 0 {
		return ps[i]
	}
	return nil
}

// checkOffload waits up to within for offloadProblems to be none, and
// returns how many are left (each an invariant broken), logging each.
func checkOffload(t *testing.T, cs []*federation.Cluster, ps []*pair, within time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		problems, err := offloadProblems(cs, ps, currentIDs(t, cs))
		if err == nil && len(problems) == 0 {
			return 0
		}
		if time.Now().After(deadline) {
			if err != nil {
				t.Errorf("offloaded pods: %v, %s after the federation converged", err, within)
				return 1
			}
			for _, p := range problems {
				t.Errorf("offloaded pods: %s, %s after the federation converged", p, within)
			}
			return len(problems)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// setOffloading sets prov's spec.offloading for cons's Peer (by cons's
// current identity).
func setOffloading(t *testing.T, prov, cons *federation.Cluster, o v1alpha1.Offloading) {
	t.Helper()
	peer, err := peerOf(prov, identityOf(t, cons))
	if err != nil {
		t.Fatalf("%s's Peer of %s: %v", prov.Name, cons.Name, err)
	}
	patch := client.MergeFrom(peer.DeepCopy())
	peer.Spec.Offloading = o
	if err := prov.Client.Patch(context.Background(), &peer, patch); err != nil {
		t.Fatalf("%s: set offloading %q for %s: %v", prov.Name, o, cons.Name, err)
	}
}

// tenantExists says whether prov holds cons's tenant namespace.
func tenantExists(t *testing.T, prov, cons *federation.Cluster) bool {
	t.Helper()
	_, err := prov.CP.Client.CoreV1().Namespaces().Get(context.Background(), offload.TenantNamespace(identityOf(t, cons)), metav1.GetOptions{})
	switch {
	case err == nil:
		return true
	case apierrors.IsNotFound(err):
		return false
	}
	t.Fatalf("%s: tenant namespace of %s: %v", prov.Name, cons.Name, err)
	return false
}

// until polls cond every 20 ms for up to within, failing t with what.
func until(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// offloadSettle bounds how long, after the federation converged, the
// offloaded pods may take to be as they should: a provider back under a
// new identity has a new virtual node, and the pods bound to the old one
// wait for the pod garbage collector (its 40 s quarantine) before the
// Deployment makes them again.
const offloadSettle = 3 * time.Minute

// killMidGrant: v, as a provider, grants offloading to the next cluster
// (not its workload's consumer) afresh: revoked (Deny), then the spec
// cleared so that the policy (auto) grants it again; and the agent of the provider or
// of the consumer, in turn, is SIGKILLed as soon as the grant shows on
// its side: the tenant namespace made on the provider, the credential's
// condition changed on the consumer. Restarted at once on its state, the
// consumer must come to hold a working credential.
func killMidGrant(t *testing.T, f *fed, v *federation.Cluster) int {
	o := spareConsumer(f, v)
	if o == nil {
		t.Logf("kill-mid-grant: %s has no peer to grant but its workload's consumer: nothing done", v.Name)
		return 0
	}
	// The grant held (auto) is revoked first, and gone on both sides, so
	// that the one made next is new.
	setOffloading(t, v, o, v1alpha1.OffloadingDeny)
	until(t, 2*time.Minute, fmt.Sprintf("%s's grant to %s revoked", v.Name, o.Name), func() bool {
		r, err := credentialReason(o, v)
		return err == nil && r != "Ready" && r != "Unverified" && !tenantExists(t, v, o)
	})
	before, _ := credentialReason(o, v)
	f.grants++
	killed := v
	seen := func() bool { return tenantExists(t, v, o) }
	if f.grants%2 == 0 {
		killed = o
		seen = func() bool { r, err := credentialReason(o, v); return err == nil && r != before }
	}
	setOffloading(t, v, o, v1alpha1.OffloadingDefault)
	until(t, 2*time.Minute, fmt.Sprintf("%s's new grant to %s seen on %s", v.Name, o.Name, killed.Name), seen)
	killed.Agent.Kill()
	<-killed.Agent.Done()
	t.Logf("%s's agent killed as %s's grant to %s showed on it", killed.Name, v.Name, o.Name)
	restarted := time.Now()
	killed.StartAgent(t)
	waitReady(t, killed, 2*time.Minute)
	if err := credentialWithin(o, v, 2*time.Minute); err != nil {
		t.Errorf("after kill-mid-grant: %v", err)
		return 1
	}
	t.Logf("%s holds a Ready credential from %s %s after the restart", o.Name, v.Name, time.Since(restarted).Round(10*time.Millisecond))
	return 0
}

// spareConsumer is the first cluster after v (in a ring) that is not the
// consumer of v's workload, or nil.
func spareConsumer(f *fed, v *federation.Cluster) *federation.Cluster {
	i := slices.Index(f.cs, v)
	for k := 1; k < len(f.cs); k++ {
		o := f.cs[(i+k)%len(f.cs)]
		if !slices.ContainsFunc(f.pairs, func(p *pair) bool { return p.prov == v && p.cons == o }) {
			return o
		}
	}
	return nil
}

// killMidOffload: the workload of v's pair (the first pair when v is in
// none) scaled up to workScaled or back down, in turn, and its consumer's
// agent SIGKILLed as soon as the first pod there is made or deleted,
// while the others are; restarted at once on its state.
func killMidOffload(t *testing.T, f *fed, v *federation.Cluster) int {
	if len(f.pairs) == 0 {
		t.Logf("kill-mid-offload: no pair offloads: nothing done")
		return 0
	}
	p := f.pairs[0]
	if i := slices.IndexFunc(f.pairs, func(p *pair) bool { return p.cons == v || p.prov == v }); i >= 0 {
		p = f.pairs[i]
	}
	count := func() int {
		rps, err := remotePods(p.prov)
		if err != nil {
			t.Fatalf("%s: %v", p.prov.Name, err)
		}
		id, n := identityOf(t, p.cons), 0
		for _, rp := range rps {
			if rp.consumer == id {
				n++
			}
		}
		return n
	}
	before := count()
	want := int32(workScaled)
	if p.replicas == workScaled {
		want = workReplicas
	}
	patch := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, want)
	if _, err := p.cons.CP.Client.AppsV1().Deployments(offloadNS).Patch(context.Background(), workloadName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("%s: scale %s to %d: %v", p.cons.Name, workloadName, want, err)
	}
	p.replicas = want
	until(t, 2*time.Minute, fmt.Sprintf("%s's pods on %s changing from %d toward %d", p.cons.Name, p.prov.Name, before, want), func() bool {
		n := count()
		return (want > int32(before) && n > before) || (want < int32(before) && n < before)
	})
	p.cons.Agent.Kill()
	<-p.cons.Agent.Done()
	t.Logf("%s's agent killed as its pods on %s went from %d toward %d", p.cons.Name, p.prov.Name, before, want)
	p.cons.StartAgent(t)
	waitReady(t, p.cons, 2*time.Minute)
	return 0
}
