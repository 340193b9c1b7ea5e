package tenancy

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/syncbuf"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/test/harness"
)

// From the provider's admin setting spec.offloading to Grant to the
// consumer's Peer saying Ready, with Grants and remote.Consumer in this
// process on two real control planes (the peering channel a direct call)
// and every API request they make recorded (harness.Trace): how many of
// each verb and resource each side made until Ready, how many of them
// one after another (the sequential depth), and, for the first round,
// the timeline of requests and watch data. The provider's own check of
// the token (a SelfSubjectReview made without the agent's client) is not
// among them: it is the gap after serviceaccounts/token. Each round
// starts from nothing: the grant before revoked, its tenant gone. The
// counts and the depth do not depend on the machine's load; the time
// does (the end-to-end figure is BenchmarkGrantToCredential in test/e2e).
func BenchmarkGrantRoundTrips(b *testing.B) {
	harness.Require(b, harness.NeedsControlPlane...)
	ctrllog.SetLogger(logr.Discard())
	env := harness.New(b)
	cps := env.ControlPlanes(2, harness.ControlPlaneOptions{})
	tr := harness.NewTrace()
	w := &world{provCP: cps[0], consCP: cps[1], logs: &syncbuf.Buffer{}, tokens: &tokenLog{}, trace: tr}
	w.provClient, w.consClient = peerClient(b, w.config(cps[0], "provider")), peerClient(b, w.config(cps[1], "consumer"))
	provAdmin, consAdmin := peerClient(b, cps[0].Config), peerClient(b, cps[1].Config) // the benchmark's own, untraced
	offloadtest.MustApplyCRDsTo(b, cps...)
	offloadtest.InstallProvider(b, w.provCP)
	w.startFences(b)
	p := w.newProvider(b, providerOptions{})
	c := w.startConsumer(b, "auto", p)
	w.createPeer(b, consAdmin, p.id.ClusterID(), v1alpha1.PeerSpec{})
	w.createPeer(b, provAdmin, c.id.ClusterID(), v1alpha1.PeerSpec{Offloading: v1alpha1.OffloadingDeny})
	p.member(c.id, true)
	consumer, provider := c.id.ClusterID(), p.id.ClusterID()
	setOffloading := func(o v1alpha1.Offloading) {
		w.updatePeer(b, provAdmin, consumer, func(peer *v1alpha1.Peer) { peer.Spec.Offloading = o })
	}
	var rounds harness.Rounds
	for i := 0; b.Loop(); i++ {
		tr.WaitQuiet()
		tr.Reset()
		start := time.Now()
		setOffloading(v1alpha1.OffloadingGrant)
		waitCredential(b, consAdmin, provider, "Ready")
		rounds.Add(tr, time.Since(start))
		if i == 0 {
			tr.Report(os.Stdout, "BenchmarkGrantRoundTrips: requests until Ready, first round")
			tr.WaitQuiet()
			tr.Report(os.Stdout, "BenchmarkGrantRoundTrips: every request of the first round, until none came for 200 ms")
		}
		setOffloading(v1alpha1.OffloadingDeny)
		waitCredential(b, consAdmin, provider, "Revoked")
		w.waitGone(b, offload.TenantNamespace(consumer))
	}
	rounds.Report(os.Stdout, b, "BenchmarkGrantRoundTrips")
}

// waitCredential polls, untraced, until the consumer's Peer of provider
// says reason in its OffloadCredential condition.
func waitCredential(b *testing.B, c client.Client, provider, reason string) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var peer v1alpha1.Peer
		err := c.Get(context.Background(), client.ObjectKey{Name: provider}, &peer)
		cond := meta.FindStatusCondition(peer.Status.Conditions, v1alpha1.ConditionOffloadCredential)
		if err == nil && cond != nil && cond.Reason == reason {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("the consumer's Peer of %s: %+v (err %v) after 30s, want %s", provider, cond, err, reason)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
