package chaos_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/test/federation"
)

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
// cleared so that the policy (auto) grants it again; and the agent of the
// provider or of the consumer, in turn, is SIGKILLed as soon as the grant
// shows on its side: the tenant namespace made on the provider, the
// credential's condition changed on the consumer. Restarted at once on
// its state, the consumer must come to hold a working credential.
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
	// The invariants held when the last fault was checked; a change that
	// check did not wait for (a grant revoked late, say) shows here as
	// pods not where the workload wants them: counted broken, rather
	// than waited for as a scale that never comes.
	before := count()
	for deadline := time.Now().Add(offloadSettle); before != int(p.replicas); before = count() {
		if time.Now().After(deadline) {
			t.Errorf("kill-mid-offload: %s has %d pods on %s before the fault, want %d (the workload's replicas) since the last check", p.cons.Name, before, p.prov.Name, p.replicas)
			return 1
		}
		time.Sleep(500 * time.Millisecond)
	}
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

// offloadKept records, before a partition, each pair's tenant namespace
// on its provider and its consumer's workload pods, and returns the check
// that, once the pods settled after the heal, both are the same objects:
// a partition is not a revocation (docs/offload.md, "Revocation"), so
// nothing was removed and made again. The witness that a revocation
// would show by then: the provider decides at the end of the grace,
// during the partition, which outlasts it, and removes the tenant
// namespace at once.
func offloadKept(t *testing.T, pairs []*pair) func(t *testing.T) int {
	type kept struct {
		tenant types.UID
		pods   []types.UID
	}
	read := func(t *testing.T, p *pair) kept {
		ctx := context.Background()
		var k kept
		ns, err := p.prov.CP.Client.CoreV1().Namespaces().Get(ctx, offload.TenantNamespace(identityOf(t, p.cons)), metav1.GetOptions{})
		if err == nil && ns.DeletionTimestamp == nil {
			k.tenant = ns.UID
		}
		pods, err := p.cons.CP.Client.CoreV1().Pods(offloadNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("%s: %v", p.cons.Name, err)
		}
		for _, pod := range pods.Items {
			if pod.DeletionTimestamp == nil {
				k.pods = append(k.pods, pod.UID)
			}
		}
		slices.Sort(k.pods)
		return k
	}
	before := map[*pair]kept{}
	for _, p := range pairs {
		before[p] = read(t, p)
	}
	return func(t *testing.T) int {
		broken := 0
		for _, p := range pairs {
			now := read(t, p)
			if now.tenant != before[p].tenant {
				t.Errorf("%s's tenant namespace on %s is %q after the partition, was %q: revoked and granted again", p.cons.Name, p.prov.Name, now.tenant, before[p].tenant)
				broken++
			}
			if !slices.Equal(now.pods, before[p].pods) {
				t.Errorf("%s's pods of %s/%s after the partition %v, before %v: pulled back and made again", p.cons.Name, offloadNS, workloadName, now.pods, before[p].pods)
				broken++
			}
		}
		return broken
	}
}
