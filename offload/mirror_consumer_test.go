package offload

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload/grant"
)

// matchesPattern compares s to p, where '?' in p stands for any character.
func matchesPattern(s, p string) bool {
	for i := range p {
		if p[i] != '?' && p[i] != s[i] {
			return false
		}
	}
	return true
}

// closedAddress is a loopback address nothing listens on.
func closedAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestMirrorConsumer runs the consumer's controller against a real
// consumer control plane and two real providers; the subtests run in
// order and use local namespaces of their own.
func TestMirrorConsumer(t *testing.T) {
	e := newMirrorEnv(t)
	p1, p2 := e.providers[0], e.providers[1]
	top := t // the controller outlives each subtest
	stop := e.start(top)

	t.Run("OnlyTheSelectedProvider", func(t *testing.T) {
		e.offload(t, "shop", "offload", v1alpha1.NamespaceOffloadSpec{
			ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"region": "a"}}})
		remote, _ := RemoteNamespace(v1alpha1.MappingDefaultName, "shop", "", e.self)
		r := p1.waitRequest(t, "shop", remote)
		if r.Labels[v1alpha1.LabelMirroredFrom] != "shop" {
			t.Errorf("request labels %v", r.Labels)
		}
		// The status is written in the pass that wrote p1's request and
		// looked at p2: by then p2 would have its own.
		o := e.waitStatus(t, "shop", "p1 pending", phaseIs(v1alpha1.OffloadInProgress, map[string]string{"p1": ReasonPending}))
		if !controllerutil.ContainsFinalizer(o, v1alpha1.FinalizerOffload) {
			t.Errorf("finalizers %v", o.Finalizers)
		}
		if rs := p2.requests(t, "shop"); len(rs) != 0 {
			t.Errorf("p2, not selected, has requests %v", requestNames(rs))
		}
		// Ready comes from the provider's answer through the watch: the
		// controller has no resync or polling interval.
		p1.answerAsProvider(t, remote, v1alpha1.RequestCreated, "Created", "")
		o = e.waitStatus(t, "shop", "Ready", phaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created"}))
		if o.Status.Clusters[0].RemoteNamespace != remote || o.Status.Clusters[0].ClusterID != p1.id {
			t.Errorf("cluster status %+v", o.Status.Clusters[0])
		}
		// The placement webhook's namespaceSelector.
		e.waitOffloadedLabel(t, "shop", true)
	})

	t.Run("OffloadedLabelIsOurs", func(t *testing.T) {
		// Taken off by hand, it comes back while the namespace is
		// offloaded; put on a namespace that is not, it goes.
		e.removeOffloadedLabel(t, "shop")
		e.waitOffloadedLabel(t, "shop", true)
		if err := e.lc.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plain", Labels: map[string]string{LabelOffloaded: "true"}}}); err != nil {
			t.Fatal(err)
		}
		e.waitOffloadedLabel(t, "plain", false)
	})

	t.Run("RefusalsShowTheirReason", func(t *testing.T) {
		// No selector: every provider that granted this cluster.
		e.offload(t, "refused", "offload", v1alpha1.NamespaceOffloadSpec{NamespaceMapping: v1alpha1.MappingSameName})
		p1.waitRequest(t, "refused", "refused")
		p2.waitRequest(t, "refused", "refused")
		p1.answerAsProvider(t, "refused", v1alpha1.RequestCreated, "Created", "")
		p2.answerAsProvider(t, "refused", v1alpha1.RequestRefused, "OverLimit", "the grant allows 0 more namespaces")
		o := e.waitStatus(t, "refused", "SomeFailed", phaseIs(v1alpha1.OffloadSomeFailed, map[string]string{"p1": "Created", "p2": "OverLimit"}))
		for _, c := range o.Status.Clusters {
			if r := meta.FindStatusCondition(c.Conditions, ConditionReady); c.ClusterName == "p2" && r.Message != "the grant allows 0 more namespaces" {
				t.Errorf("p2's message %q, want the provider's", r.Message)
			}
		}
		p1.answerAsProvider(t, "refused", v1alpha1.RequestRefused, "AlreadyExists", "namespace refused exists and is not yours")
		e.waitStatus(t, "refused", "AllFailed", phaseIs(v1alpha1.OffloadAllFailed, map[string]string{"p1": "AlreadyExists", "p2": "OverLimit"}))
	})

	t.Run("ProviderNoLongerSelected", func(t *testing.T) {
		e.setLabels(t, p2.id, map[string]string{"region": "a"})
		remote, _ := RemoteNamespace(v1alpha1.MappingDefaultName, "shop", "", e.self)
		p2.waitRequest(t, "shop", remote)
		e.waitStatus(t, "shop", "p2 selected", phaseIs(v1alpha1.OffloadInProgress, map[string]string{"p1": "Created", "p2": ReasonPending}))
		e.setLabels(t, p2.id, map[string]string{"region": "b"})
		eventually.Within(t, 30*time.Second, "p2's request deleted", func() error {
			if rs := p2.requests(t, "shop"); len(rs) != 0 {
				return fmt.Errorf("requests %v", requestNames(rs))
			}
			return nil
		})
		e.waitStatus(t, "shop", "p1 alone", phaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created"}))
		p1.waitRequest(t, "shop", remote)
	})

	t.Run("UnreachableProvider", func(t *testing.T) {
		far := newConsumer(t)
		addr := closedAddress(t)
		e.creds.set(far, providerCredential{
			config: &rest.Config{Host: "https://" + addr, BearerToken: "none", Timeout: 2 * time.Second},
			grant:  grant.Grant{Provider: far, Consumer: e.self, Serial: 1, Server: "https://" + addr, Namespace: TenantNamespace(e.self)},
		})
		e.addPeer(t, far, "far", map[string]string{"region": "far"})
		e.offload(t, "far", "offload", v1alpha1.NamespaceOffloadSpec{
			ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"region": "far"}}})
		o := e.waitStatus(t, "far", "Unreachable", phaseIs(v1alpha1.OffloadAllFailed, map[string]string{"far": ReasonUnreachable}))
		if r := meta.FindStatusCondition(o.Status.Clusters[0].Conditions, ConditionReady); !strings.Contains(r.Message, addr) {
			t.Errorf("message %q does not name the API server %s", r.Message, addr)
		}
		// Deleting waits for the unreachable provider, until it no longer
		// grants: revoking removed everything there.
		if err := e.lc.Delete(t.Context(), o); err != nil {
			t.Fatal(err)
		}
		e.waitStatus(t, "far", "Terminating", phaseIs(v1alpha1.OffloadTerminating, map[string]string{"far": ReasonUnreachable}))
		e.creds.drop(far)
		if err := e.lc.Delete(t.Context(), &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: far}}); err != nil {
			t.Fatal(err)
		}
		e.waitGone(t, "far")
	})

	t.Run("DeletionRemovesRemoteNamespacesFirst", func(t *testing.T) {
		remote, _ := RemoteNamespace(v1alpha1.MappingDefaultName, "shop", "", e.self)
		if err := e.lc.Delete(t.Context(), &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "offload"}}); err != nil {
			t.Fatal(err)
		}
		e.waitStatus(t, "shop", "Terminating", phaseIs(v1alpha1.OffloadTerminating, map[string]string{"p1": ReasonDeleting}))
		// The label went before the status said Terminating: no pod
		// created from then on is sent to a provider.
		if v, ok := e.namespaceLabels(t, "shop")[LabelOffloaded]; ok {
			t.Errorf("namespace shop still labelled %s=%s while its offload terminates", LabelOffloaded, v)
		}
		// The request is deleted and held by the provider's finalizer; the
		// NamespaceOffload waits for it.
		eventually.Within(t, 30*time.Second, "request deleted", func() error {
			rs := p1.requests(t, "shop")
			if len(rs) != 1 || rs[0].DeletionTimestamp == nil {
				return fmt.Errorf("requests %v", requestNames(rs))
			}
			return nil
		})
		p1.releaseAsProvider(t, remote)
		e.waitGone(t, "shop")
		if rs := p1.requests(t, "shop"); len(rs) != 0 {
			t.Errorf("requests left %v", requestNames(rs))
		}
	})

	t.Run("RestartConverges", func(t *testing.T) {
		e.offload(t, "again", "offload", v1alpha1.NamespaceOffloadSpec{
			ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"region": "a"}}})
		remote, _ := RemoteNamespace(v1alpha1.MappingDefaultName, "again", "", e.self)
		before := p1.waitRequest(t, "again", remote)
		p1.answerAsProvider(t, remote, v1alpha1.RequestCreated, "Created", "")
		e.waitStatus(t, "again", "Ready", phaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created"}))
		stop()
		// While it is down, p2 comes to match.
		e.setLabels(t, p2.id, map[string]string{"region": "a"})
		stop = e.start(top)
		p2.waitRequest(t, "again", remote)
		p2.answerAsProvider(t, remote, v1alpha1.RequestCreated, "Created", "")
		e.waitStatus(t, "again", "Ready on both", phaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created", "p2": "Created"}))
		after := p1.waitRequest(t, "again", remote)
		if after.UID != before.UID {
			t.Errorf("p1's request was recreated (uid %s, was %s)", after.UID, before.UID)
		}
	})
	t.Run("SecondOffloadInANamespaceIsIgnored", func(t *testing.T) {
		e.offload(t, "again", "second", v1alpha1.NamespaceOffloadSpec{NamespaceMapping: v1alpha1.MappingSameName})
		eventually.Within(t, 30*time.Second, "the second says it is ignored", func() error {
			var o v1alpha1.NamespaceOffload
			if err := e.lc.Get(t.Context(), client.ObjectKey{Namespace: "again", Name: "second"}, &o); err != nil {
				return err
			}
			if err := phaseIs(v1alpha1.OffloadAllFailed, map[string]string{"p1": ReasonDuplicate, "p2": ReasonDuplicate})(&o); err != nil {
				return fmt.Errorf("%w: %s", err, describeOffload(&o))
			}
			if r := meta.FindStatusCondition(o.Status.Clusters[0].Conditions, ConditionReady); !strings.Contains(r.Message, "NamespaceOffload offload") {
				return fmt.Errorf("message %q does not name the one acting", r.Message)
			}
			if len(o.Finalizers) != 0 {
				return fmt.Errorf("finalizers %v", o.Finalizers)
			}
			return nil
		})
		// Its status was written in the pass that kept the first's
		// requests: still one per provider, under the first's name.
		remote, _ := RemoteNamespace(v1alpha1.MappingDefaultName, "again", "", e.self)
		p1.waitRequest(t, "again", remote)
		p2.waitRequest(t, "again", remote)
	})
}

// The consumer's clients of a provider never hold a request back on
// their side (client-go's default is 5 a second, bursts of 10): a
// hundred namespaces offloaded at once are a hundred requests there.
func TestCredentialConfigDoesNotThrottle(t *testing.T) {
	cs, err := kubernetes.NewForConfig(restConfigOf(grant.Grant{Server: "https://127.0.0.1:6443"}))
	if err != nil {
		t.Fatal(err)
	}
	l := cs.CoreV1().RESTClient().GetRateLimiter()
	if l == nil {
		return
	}
	for i := range 500 {
		if !l.TryAccept() {
			t.Fatalf("the client of a provider holds request %d back (client-side rate limit %v a second)", i+1, l.QPS())
		}
	}
}
