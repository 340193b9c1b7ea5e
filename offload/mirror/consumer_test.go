package mirror_test

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
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/internal/offloadenv"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/offload/mirror"
	"github.com/flotilla-io/flotilla/offload/remote"
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
	e := offloadenv.NewMirrorEnv(t)
	p1, p2 := e.Providers[0], e.Providers[1]
	top := t // the controller outlives each subtest
	stop := e.Start(top)

	t.Run("OnlyTheSelectedProvider", func(t *testing.T) {
		e.Offload(t, "shop", "offload", v1alpha1.NamespaceOffloadSpec{
			ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"region": "a"}}})
		remote, _ := offload.RemoteNamespace(v1alpha1.MappingDefaultName, "shop", "", e.Self)
		r := p1.WaitRequest(t, "shop", remote)
		if r.Labels[v1alpha1.LabelMirroredFrom] != "shop" {
			t.Errorf("request labels %v", r.Labels)
		}
		// The status is written in the pass that wrote p1's request and
		// looked at p2: by then p2 would have its own.
		o := e.WaitStatus(t, "shop", "p1 pending", offloadenv.PhaseIs(v1alpha1.OffloadInProgress, map[string]string{"p1": mirror.ReasonPending}))
		if !controllerutil.ContainsFinalizer(o, v1alpha1.FinalizerOffload) {
			t.Errorf("finalizers %v", o.Finalizers)
		}
		if rs := p2.Requests(t, "shop"); len(rs) != 0 {
			t.Errorf("p2, not selected, has requests %v", offloadenv.RequestNames(rs))
		}
		// Ready comes from the provider's answer through the watch: the
		// controller has no resync or polling interval.
		p1.AnswerAsProvider(t, remote, v1alpha1.RequestCreated, "Created", "")
		o = e.WaitStatus(t, "shop", "Ready", offloadenv.PhaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created"}))
		if o.Status.Clusters[0].RemoteNamespace != remote || o.Status.Clusters[0].ClusterID != p1.ID {
			t.Errorf("cluster status %+v", o.Status.Clusters[0])
		}
		// The placement webhook's namespaceSelector, set as the
		// administrator does.
		e.WaitStatus(t, "shop", "Placement Labelled", offloadenv.PlacementIs(metav1.ConditionTrue, v1alpha1.ReasonLabelled))
	})

	// Selection is the local admin's: an empty selector picks nobody, and
	// the name a peer gives itself (the agent's flotilla.io/cluster-name
	// label) picks nobody either. The positive witness: the same pass
	// selects p1 by the admin's label in another namespace (shop, above,
	// Ready), and these are processed (their status written).
	for _, tc := range []struct {
		ns  string
		sel *metav1.LabelSelector
	}{
		{"empty", &metav1.LabelSelector{}},
		{"unset", nil},
		{"selfnamed", &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelClusterName: "p1"}}},
	} {
		t.Run("NothingSelectedBy/"+tc.ns, func(t *testing.T) {
			if err := e.LocalAdmin.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tc.ns}}); err != nil {
				t.Fatal(err)
			}
			o := &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: tc.ns, Name: "offload"},
				Spec: v1alpha1.NamespaceOffloadSpec{ClusterSelector: tc.sel}}
			if err := e.LocalAdmin.Create(t.Context(), o); err != nil {
				t.Fatal(err)
			}
			e.WaitStatus(t, tc.ns, "NoClusterSelected", offloadenv.PhaseIs(v1alpha1.OffloadNoClusterSelected, map[string]string{}))
			for _, p := range e.Providers {
				if rs := p.Requests(t, tc.ns); len(rs) != 0 {
					t.Errorf("%s has requests %v", p.ID, offloadenv.RequestNames(rs))
				}
			}
		})
	}

	// The label that sends a namespace's pods to the placement webhook
	// is the administrator's: the agent says when it is missing, and
	// never puts it on or takes it off.
	t.Run("PlacementNeedsTheAdministratorsLabel", func(t *testing.T) {
		if err := e.LocalAdmin.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}); err != nil {
			t.Fatal(err)
		}
		o := &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: "bare", Name: "offload"},
			Spec: v1alpha1.NamespaceOffloadSpec{ClusterSelector: offloadenv.EveryProvider()}}
		if err := e.LocalAdmin.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
		got := e.WaitStatus(t, "bare", "Placement NotLabelled", offloadenv.PlacementIs(metav1.ConditionFalse, v1alpha1.ReasonNotLabelled))
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionPlacement)
		if !strings.Contains(c.Message, "flotilla offload namespace bare") || !strings.Contains(c.Message, "kubectl label namespace bare "+offload.LabelOffloaded+"=true") {
			t.Errorf("Placement's message %q does not say how to set the label", c.Message)
		}
		if _, ok := e.NamespaceLabels(t, "bare")[offload.LabelOffloaded]; ok {
			t.Errorf("namespace bare labelled %s by the agent", offload.LabelOffloaded)
		}
		e.LabelOffloaded(t, "bare", true)
		e.WaitStatus(t, "bare", "Placement Labelled", offloadenv.PlacementIs(metav1.ConditionTrue, v1alpha1.ReasonLabelled))
		// Taken off by the administrator, it stays off: the condition
		// that follows it is the witness that the agent has looked.
		e.LabelOffloaded(t, "bare", false)
		e.WaitStatus(t, "bare", "Placement NotLabelled again", offloadenv.PlacementIs(metav1.ConditionFalse, v1alpha1.ReasonNotLabelled))
		if v, ok := e.NamespaceLabels(t, "bare")[offload.LabelOffloaded]; ok {
			t.Errorf("namespace bare labelled %s=%q again by the agent", offload.LabelOffloaded, v)
		}
	})

	t.Run("RefusalsShowTheirReason", func(t *testing.T) {
		e.Offload(t, "refused", "offload", v1alpha1.NamespaceOffloadSpec{
			ClusterSelector: offloadenv.EveryProvider(), NamespaceMapping: v1alpha1.MappingSameName})
		p1.WaitRequest(t, "refused", "refused")
		p2.WaitRequest(t, "refused", "refused")
		p1.AnswerAsProvider(t, "refused", v1alpha1.RequestCreated, "Created", "")
		p2.AnswerAsProvider(t, "refused", v1alpha1.RequestRefused, "OverLimit", "the grant allows 0 more namespaces")
		o := e.WaitStatus(t, "refused", "SomeFailed", offloadenv.PhaseIs(v1alpha1.OffloadSomeFailed, map[string]string{"p1": "Created", "p2": "OverLimit"}))
		for _, c := range o.Status.Clusters {
			if r := meta.FindStatusCondition(c.Conditions, offload.ConditionReady); c.ClusterName == "p2" && r.Message != "the grant allows 0 more namespaces" {
				t.Errorf("p2's message %q, want the provider's", r.Message)
			}
		}
		p1.AnswerAsProvider(t, "refused", v1alpha1.RequestRefused, "AlreadyExists", "namespace refused exists and is not yours")
		e.WaitStatus(t, "refused", "AllFailed", offloadenv.PhaseIs(v1alpha1.OffloadAllFailed, map[string]string{"p1": "AlreadyExists", "p2": "OverLimit"}))
	})

	t.Run("ProviderNoLongerSelected", func(t *testing.T) {
		e.SetLabels(t, p2.ID, map[string]string{"region": "a"})
		remote, _ := offload.RemoteNamespace(v1alpha1.MappingDefaultName, "shop", "", e.Self)
		p2.WaitRequest(t, "shop", remote)
		e.WaitStatus(t, "shop", "p2 selected", offloadenv.PhaseIs(v1alpha1.OffloadInProgress, map[string]string{"p1": "Created", "p2": mirror.ReasonPending}))
		e.SetLabels(t, p2.ID, map[string]string{"region": "b"})
		eventually.Within(t, 30*time.Second, "p2's request deleted", func() error {
			if rs := p2.Requests(t, "shop"); len(rs) != 0 {
				return fmt.Errorf("requests %v", offloadenv.RequestNames(rs))
			}
			return nil
		})
		e.WaitStatus(t, "shop", "p1 alone", offloadenv.PhaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created"}))
		p1.WaitRequest(t, "shop", remote)
	})

	t.Run("UnreachableProvider", func(t *testing.T) {
		far := offloadtest.NewConsumer(t)
		addr := closedAddress(t)
		e.Creds.Set(far, remote.ProviderCredential{
			Config: &rest.Config{Host: "https://" + addr, BearerToken: "none", Timeout: 2 * time.Second},
			Grant:  grant.Grant{Provider: far, Consumer: e.Self, Serial: 1, Server: "https://" + addr, Namespace: offload.TenantNamespace(e.Self)},
		})
		e.AddPeer(t, far, "far", map[string]string{"region": "far"})
		e.Offload(t, "far", "offload", v1alpha1.NamespaceOffloadSpec{
			ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"region": "far"}}})
		o := e.WaitStatus(t, "far", "Unreachable", offloadenv.PhaseIs(v1alpha1.OffloadAllFailed, map[string]string{"far": mirror.ReasonUnreachable}))
		if r := meta.FindStatusCondition(o.Status.Clusters[0].Conditions, offload.ConditionReady); !strings.Contains(r.Message, addr) {
			t.Errorf("message %q does not name the API server %s", r.Message, addr)
		}
		// Deleting waits for the unreachable provider, until it no longer
		// grants: revoking removed everything there.
		if err := e.LocalAdmin.Delete(t.Context(), o); err != nil {
			t.Fatal(err)
		}
		e.WaitStatus(t, "far", "Terminating", offloadenv.PhaseIs(v1alpha1.OffloadTerminating, map[string]string{"far": mirror.ReasonUnreachable}))
		e.Creds.Drop(far)
		if err := e.LocalAdmin.Delete(t.Context(), &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: far}}); err != nil {
			t.Fatal(err)
		}
		e.WaitGone(t, "far")
	})

	t.Run("DeletionRemovesRemoteNamespacesFirst", func(t *testing.T) {
		remote, _ := offload.RemoteNamespace(v1alpha1.MappingDefaultName, "shop", "", e.Self)
		// As `flotilla unoffload` does: the label first, so that no pod
		// created from then on is sent to a provider.
		e.LabelOffloaded(t, "shop", false)
		if err := e.LocalAdmin.Delete(t.Context(), &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "offload"}}); err != nil {
			t.Fatal(err)
		}
		e.WaitStatus(t, "shop", "Terminating", offloadenv.PhaseIs(v1alpha1.OffloadTerminating, map[string]string{"p1": mirror.ReasonDeleting}))
		// The request is deleted and held by the provider's finalizer; the
		// NamespaceOffload waits for it.
		eventually.Within(t, 30*time.Second, "request deleted", func() error {
			rs := p1.Requests(t, "shop")
			if len(rs) != 1 || rs[0].DeletionTimestamp == nil {
				return fmt.Errorf("requests %v", offloadenv.RequestNames(rs))
			}
			return nil
		})
		p1.ReleaseAsProvider(t, remote)
		e.WaitGone(t, "shop")
		if rs := p1.Requests(t, "shop"); len(rs) != 0 {
			t.Errorf("requests left %v", offloadenv.RequestNames(rs))
		}
	})

	t.Run("RestartConverges", func(t *testing.T) {
		e.Offload(t, "again", "offload", v1alpha1.NamespaceOffloadSpec{
			ClusterSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"region": "a"}}})
		remote, _ := offload.RemoteNamespace(v1alpha1.MappingDefaultName, "again", "", e.Self)
		before := p1.WaitRequest(t, "again", remote)
		p1.AnswerAsProvider(t, remote, v1alpha1.RequestCreated, "Created", "")
		e.WaitStatus(t, "again", "Ready", offloadenv.PhaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created"}))
		stop()
		// While it is down, p2 comes to match.
		e.SetLabels(t, p2.ID, map[string]string{"region": "a"})
		stop = e.Start(top)
		p2.WaitRequest(t, "again", remote)
		p2.AnswerAsProvider(t, remote, v1alpha1.RequestCreated, "Created", "")
		e.WaitStatus(t, "again", "Ready on both", offloadenv.PhaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created", "p2": "Created"}))
		after := p1.WaitRequest(t, "again", remote)
		if after.UID != before.UID {
			t.Errorf("p1's request was recreated (uid %s, was %s)", after.UID, before.UID)
		}
	})
	t.Run("SecondOffloadInANamespaceIsIgnored", func(t *testing.T) {
		e.Offload(t, "again", "second", v1alpha1.NamespaceOffloadSpec{
			ClusterSelector: offloadenv.EveryProvider(), NamespaceMapping: v1alpha1.MappingSameName})
		eventually.Within(t, 30*time.Second, "the second says it is ignored", func() error {
			var o v1alpha1.NamespaceOffload
			if err := e.LocalAdmin.Get(t.Context(), client.ObjectKey{Namespace: "again", Name: "second"}, &o); err != nil {
				return err
			}
			if err := offloadenv.PhaseIs(v1alpha1.OffloadAllFailed, map[string]string{"p1": mirror.ReasonDuplicate, "p2": mirror.ReasonDuplicate})(&o); err != nil {
				return fmt.Errorf("%w: %s", err, offloadenv.DescribeOffload(&o))
			}
			if r := meta.FindStatusCondition(o.Status.Clusters[0].Conditions, offload.ConditionReady); !strings.Contains(r.Message, "NamespaceOffload offload") {
				return fmt.Errorf("message %q does not name the one acting", r.Message)
			}
			if len(o.Finalizers) != 0 {
				return fmt.Errorf("finalizers %v", o.Finalizers)
			}
			return nil
		})
		// Its status was written in the pass that kept the first's
		// requests: still one per provider, under the first's name.
		remote, _ := offload.RemoteNamespace(v1alpha1.MappingDefaultName, "again", "", e.Self)
		p1.WaitRequest(t, "again", remote)
		p2.WaitRequest(t, "again", remote)
	})
}

// The consumer's clients of a provider never hold a request back on
// their side (client-go's default is 5 a second, bursts of 10): a
// hundred namespaces offloaded at once are a hundred requests there.
func TestCredentialConfigDoesNotThrottle(t *testing.T) {
	cs, err := kubernetes.NewForConfig(remote.RestConfigOf(grant.Grant{Server: "https://127.0.0.1:6443"}))
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
