package tenancy

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload/remote"
)

// 8. A consumer uses a provider's grant only once its own admin accepts
// it: under --offload-to=manual the grant is received and held (the
// consumer's Peer says it waits for the admin), but no credential is
// handed out; Accept makes it work, Deny withdraws it again. Under auto
// a grant works unless the Peer says Deny.
func (w *world) testConsumerOptIn(t *testing.T) {
	p := w.newProvider(t, providerOptions{})

	t.Run("manual", func(t *testing.T) {
		c := w.startConsumer(t, remote.UseManual, p)
		cid, pid := c.id.ClusterID(), p.id.ClusterID()
		w.createPeer(t, w.consClient, pid, v1alpha1.PeerSpec{})
		w.createPeer(t, w.provClient, cid, v1alpha1.PeerSpec{Offloading: v1alpha1.OffloadingGrant})
		p.member(c.id, true)

		// The witness that the grant arrived and was processed: the
		// provider granted, the consumer's Peer says why it is unused.
		w.waitCondition(t, w.provClient, cid, v1alpha1.ConditionOffloadGranted, true, "Granted")
		peer := w.waitCondition(t, w.consClient, pid, v1alpha1.ConditionOffloadCredential, false, remote.ReasonAwaitingOptIn)
		if msg := meta.FindStatusCondition(peer.Status.Conditions, v1alpha1.ConditionOffloadCredential).Message; !strings.Contains(msg, "offloadTo") {
			t.Errorf("the condition does not say what the admin must do: %q", msg)
		}
		if peer.Status.Offloading != nil && peer.Status.Offloading.Received != nil {
			t.Errorf("status.offloading.received %+v before the admin accepted", peer.Status.Offloading.Received)
		}
		if _, _, err := c.c.Credential(pid); err == nil {
			t.Fatal("a credential handed out before the admin accepted")
		} else {
			t.Logf("before the opt-in: %v", err)
		}

		w.updatePeer(t, w.consClient, pid, func(peer *v1alpha1.Peer) { peer.Spec.OffloadTo = v1alpha1.OffloadToAccept })
		w.waitCondition(t, w.consClient, pid, v1alpha1.ConditionOffloadCredential, true, "Ready")
		w.credentialWorks(t, c, p)

		w.updatePeer(t, w.consClient, pid, func(peer *v1alpha1.Peer) { peer.Spec.OffloadTo = v1alpha1.OffloadToDeny })
		w.waitCondition(t, w.consClient, pid, v1alpha1.ConditionOffloadCredential, false, remote.ReasonDeclined)
		if _, _, err := c.c.Credential(pid); err == nil {
			t.Fatal("a credential handed out after the admin declined")
		}
	})

	t.Run("auto", func(t *testing.T) {
		c := w.startConsumer(t, remote.UseAuto, p)
		cid, pid := c.id.ClusterID(), p.id.ClusterID()
		w.createPeer(t, w.consClient, pid, v1alpha1.PeerSpec{})
		w.createPeer(t, w.provClient, cid, v1alpha1.PeerSpec{Offloading: v1alpha1.OffloadingGrant})
		p.member(c.id, true)
		w.waitCondition(t, w.consClient, pid, v1alpha1.ConditionOffloadCredential, true, "Ready")
		w.credentialWorks(t, c, p)
		w.updatePeer(t, w.consClient, pid, func(peer *v1alpha1.Peer) { peer.Spec.OffloadTo = v1alpha1.OffloadToDeny })
		w.waitCondition(t, w.consClient, pid, v1alpha1.ConditionOffloadCredential, false, remote.ReasonDeclined)
	})
}
