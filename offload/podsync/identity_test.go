package podsync

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/offloadenv"
	"github.com/flotilla-io/flotilla/test/harness"
)

// A provider back under a new identity (its state wiped) at the same API
// server: the consumer holds a Peer, a credential and a virtual node of
// each identity, and both credentials reach the same tenant and the same
// mirrored namespace. Each consumer pod runs there exactly once, whichever
// node it is bound to; neither reflector deletes what the other made; a
// consumer pod's deletion removes its remote pod, even once the identity
// it was bound to has no credential any more.
func TestPodReflectorTwoIdentitiesOfOneProvider(t *testing.T) {
	e := newPodsEnv(t, offloadenv.PodEnvOptions{Kubelets: 1})
	oldID, newID := e.Provider.ID, e.SecondIdentity(t)
	newNode := offloadenv.KeepVirtualNodeReady(t, e.Local, newID)
	e.startReflector(t, 0, true)

	e.Offload(t, "wipe", "offload", v1alpha1.NamespaceOffloadSpec{})
	var remoteNS string
	e.WaitStatus(t, "wipe", "mirrored for both identities", func(o *v1alpha1.NamespaceOffload) error {
		a, readyA := offload.MirroredNamespace(o, oldID)
		b, readyB := offload.MirroredNamespace(o, newID)
		if !readyA || !readyB || a != b {
			return fmt.Errorf("old identity %q ready %v, new identity %q ready %v: want both ready, one namespace", a, readyA, b, readyB)
		}
		remoteNS = a
		return nil
	})

	onNode := func(name, node string) *corev1.Pod {
		p := e.podOnVirtualNode("wipe", name)
		p.Spec.NodeName = node
		return p
	}
	e.createPods(t, onNode("on-old", e.Node), onNode("on-new", newNode), onNode("canary-old", e.Node), onNode("canary-new", newNode))
	for _, name := range []string{"on-old", "on-new", "canary-old", "canary-new"} {
		e.waitReflected(t, "wipe", remoteNS, name)
	}

	t.Run("NoChurn", func(t *testing.T) {
		before := e.remotePods(t, remoteNS)
		for _, name := range []string{"on-old", "on-new", "canary-old", "canary-new"} {
			if before[name] == nil {
				t.Fatalf("no remote pod for %s just after it was reflected: deleted by the other identity's reflector?", name)
			}
		}
		list, err := e.Provider.CP.Client.CoreV1().Pods(remoteNS).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		w, err := e.Provider.CP.Client.CoreV1().Pods(remoteNS).Watch(t.Context(), metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		// on-old's pod there as the previous version made it, without
		// the label: judged by its local pod, on the old node, it is
		// left to the old identity's reflector.
		unlabel := fmt.Appendf(nil, `{"metadata":{"labels":{%q:null}}}`, offload.LabelProvider)
		if _, err := e.Provider.CP.Client.CoreV1().Pods(remoteNS).Patch(t.Context(), "on-old", types.MergePatchType, unlabel, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		// The witness that both reflectors acted since: each canary,
		// deleted out of band, is made again by its identity's reflector.
		for _, name := range []string{"canary-old", "canary-new"} {
			e.deleteAndWaitRemade(t, remoteNS, before[name])
			e.waitReflected(t, "wipe", remoteNS, name)
		}
		after := e.remotePods(t, remoteNS)
		made := map[types.UID]string{}
		for _, p := range watchUntilMarker(t, e, w, remoteNS) {
			made[p.UID] = p.Name
		}
		if got := slices.Sorted(maps.Values(made)); !slices.Equal(got, []string{"canary-new", "canary-old"}) {
			t.Errorf("remote pods made while the canaries were: %v, want the two canaries once each", got)
		}
		for _, name := range []string{"on-old", "on-new"} {
			if after[name] == nil || after[name].UID != before[name].UID {
				t.Errorf("remote pod %s was replaced or deleted: before %v", name, before[name].UID)
			}
		}
		for name, p := range after {
			want := map[string]string{"on-old": "", "canary-old": oldID, "on-new": newID, "canary-new": newID}[name]
			if p.Labels[offload.LabelProvider] != want {
				t.Errorf("remote pod %s is labelled %s=%q, want %q (the identity of the node its consumer pod is bound to)", name, offload.LabelProvider, p.Labels[offload.LabelProvider], want)
			}
		}
		if len(after) != 4 {
			t.Errorf("remote pods %v, want one for each of the 4 consumer pods", slices.Sorted(maps.Keys(after)))
		}
	})

	t.Run("DeletedWithTheirConsumerPods", func(t *testing.T) {
		for _, name := range []string{"on-old", "on-new"} {
			if err := e.Local.Client.CoreV1().Pods("wipe").Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			e.waitGonePod(t, "wipe", name, "here")
			e.waitGonePod(t, remoteNS, name, "there")
		}
	})

	t.Run("SameNameOnTheOtherNode", func(t *testing.T) {
		// A pod of a name the old node had, made again on the new node
		// (a StatefulSet's pod, say): made there once by the new
		// identity, and left alone by the old one.
		e.createPods(t, onNode("on-old", newNode))
		_, made := e.waitReflected(t, "wipe", remoteNS, "on-old")
		e.deleteAndWaitRemade(t, remoteNS, e.remotePods(t, remoteNS)["canary-old"])
		switch p := e.remotePods(t, remoteNS)["on-old"]; {
		case p == nil:
			t.Fatal("on-old deleted there")
		case p.UID != made.UID || p.Labels[offload.LabelProvider] != newID:
			t.Fatalf("on-old there is %s, labelled %q: want %s, made for the new identity %s, untouched", p.UID, p.Labels[offload.LabelProvider], made.UID, newID)
		}
	})

	t.Run("OldIdentityWithoutCredential", func(t *testing.T) {
		// The old identity's Peer loses its credential (revoked): its
		// reflector stops, the new one leaves the pod of the old node
		// alone while that pod exists, and removes it once it is gone
		// (as the pod garbage collector removes pods of a removed node).
		e.Creds.Drop(oldID)
		e.reflector().providers.Trigger()
		eventually.Within(t, 30*time.Second, "the old identity no longer served", func() error {
			if e.reflector().provider(oldID) != nil {
				return errors.New("still served")
			}
			return nil
		})
		// The witness that the new identity's reflector looked since.
		e.deleteAndWaitRemade(t, remoteNS, e.remotePods(t, remoteNS)["canary-new"])
		if e.remotePods(t, remoteNS)["canary-old"] == nil {
			t.Fatal("the old node's pod was deleted on the provider while its consumer pod exists")
		}
		if err := e.Local.Client.CoreV1().Pods("wipe").Delete(t.Context(), "canary-old", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		e.waitGonePod(t, remoteNS, "canary-old", "there")
	})
}

// deleteAndWaitRemade deletes the provider's pod p out of band and waits
// until a reflector made it again: the witness that the reflectors
// looked since.
func (e *podsEnv) deleteAndWaitRemade(t *testing.T, ns string, p *corev1.Pod) {
	t.Helper()
	e.deleteRemote(t, p)
	eventually.Within(t, 90*time.Second, p.Name+" made again", func() error {
		if now := e.remotePods(t, ns)[p.Name]; now == nil || now.UID == p.UID {
			return errors.New("not yet")
		}
		return nil
	})
}

// watchUntilMarker creates a pod of nobody's in ns on the provider (the
// reflectors never touch it) and returns the pods w saw added before it:
// the watch is in order, so every pod made before the marker is there.
func watchUntilMarker(t *testing.T, e *podsEnv, w watch.Interface, ns string) []*corev1.Pod {
	t.Helper()
	marker := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "marker"},
		Spec:       *harness.Restricted(&corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}}),
	}
	made, err := e.Provider.CP.Client.CoreV1().Pods(ns).Create(t.Context(), marker, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.Provider.CP.Client.CoreV1().Pods(ns).Delete(t.Context(), "marker", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Error(err)
		}
	}()
	var added []*corev1.Pod
	for ev := range w.ResultChan() {
		p, ok := ev.Object.(*corev1.Pod)
		switch {
		case !ok || ev.Type != watch.Added:
		case p.UID == made.UID:
			return added
		default:
			added = append(added, p)
		}
	}
	t.Fatal("the watch of the provider's pods ended before the marker")
	return nil
}
