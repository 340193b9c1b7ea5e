package deploy

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/flotilla-io/flotilla/fabric/fabricapi"
	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
)

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// The agent applies the fabric's DaemonSet and publishes the plan with its
// own token, as deploy/ grants it; a fabric pod's token reads the plan by
// name and tells an uninstall from a restart, and may change nothing.
func testFabricRequests(t *testing.T, cp *harness.ControlPlane) {
	ctx := t.Context()
	agent := kubernetes.NewForConfigOrDie(agentConfig(t, cp))
	fabric := kubernetes.NewForConfigOrDie(tokenConfig(t, cp, fabricapi.ServiceAccountName))

	pub := fabricapi.NewPublisher(agent, namespace, "flotilla-agent", slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err := pub.ApplyDaemonSet(ctx); err != nil {
		t.Fatalf("agent applies the fabric's DaemonSet: %v", err)
	}
	owner, err := cp.Client.AppsV1().Deployments(namespace).Get(ctx, "flotilla-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := cp.Client.AppsV1().DaemonSets(namespace).Get(ctx, fabricapi.DaemonSetName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the fabric's DaemonSet: %v", err)
	}
	if refs := ds.OwnerReferences; len(refs) != 1 || refs[0].UID != owner.UID || refs[0].Kind != "Deployment" {
		t.Errorf("DaemonSet owners %+v, want the agent's Deployment %s", refs, owner.UID)
	}
	pod := ds.Spec.Template.Spec
	if img := pod.Containers[0].Image; img != owner.Spec.Template.Spec.Containers[0].Image {
		t.Errorf("fabric image %q, want the agent's %q", img, owner.Spec.Template.Spec.Containers[0].Image)
	}
	if pod.ServiceAccountName != fabricapi.ServiceAccountName || !pod.HostNetwork {
		t.Errorf("fabric pods: account %q, hostNetwork %v", pod.ServiceAccountName, pod.HostNetwork)
	}
	if caps := pod.Containers[0].SecurityContext.Capabilities; len(caps.Add) != 1 || caps.Add[0] != "NET_ADMIN" {
		t.Errorf("fabric capabilities %+v, want NET_ADMIN only", caps)
	}

	plan := fabricapi.Plan{
		GatewayNode: "gateway", Gateway: netip.MustParseAddr("198.18.0.2"), TunnelInterface: "flotilla0", MTU: 1420,
		Views: []netip.Prefix{netip.MustParsePrefix("10.70.0.0/16")},
		Nodes: []fabricapi.Node{{Name: "worker", Addr: netip.MustParseAddr("198.18.0.3"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24")}}},
	}

	// A Deployment it may not read (a wrong --fabric-owner): refused on
	// every retry, said once. Its first apply follows the first plan's
	// write.
	var logged bytes.Buffer
	reg := prometheus.NewRegistry()
	wrong := fabricapi.NewPublisher(agent, namespace, "someone-else", slog.New(slog.NewTextHandler(&logged, nil)), reg)
	wrong.Set(plan)
	wrongCtx, stopWrong := context.WithTimeout(ctx, 2*time.Second)
	wrong.Run(wrongCtx)
	stopWrong()
	if n := strings.Count(logged.String(), "cannot publish the fabric"); n != 1 || !strings.Contains(logged.String(), "forbidden") {
		t.Errorf("a refusal that repeats was logged %d times, want once, saying forbidden:\n%s", n, logged.String())
	}
	if n := counterValue(t, reg, "flotilla_fabric_plan_write_errors_total"); n < 3 {
		t.Errorf("%v failed attempts in 2 s, want at least 3 (retried with a backoff from 100 ms)", n)
	}
	if !strings.Contains(logged.String(), "fabric plan published") {
		t.Errorf("the plan was not written before the DaemonSet's apply:\n%s", logged.String())
	}
	pubCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- pub.Run(pubCtx) }()
	var stopOnce sync.Once
	stopPublisher := func() { stopOnce.Do(func() { stop(); <-done }) }
	defer stopPublisher()
	pub.Set(plan)

	got := make(chan fabricapi.Plan, 10)
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() {
		watched <- fabricapi.Watch(watchCtx, fabric, namespace, func(p fabricapi.Plan, err error) {
			if err == nil {
				got <- p
			}
		})
	}()
	defer func() { stopWatch(); <-watched }()
	select {
	case p := <-got:
		if !reflect.DeepEqual(p, plan) {
			t.Errorf("fabric reads\n  %+v\nagent published\n  %+v", p, plan)
		}
	case err := <-watched:
		t.Fatalf("fabric watches the plan: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the fabric's token saw no plan in 30 s")
	}

	// The fabric's token follows the replicas' Lease by name, and may not
	// change it.
	holders := make(chan string, 10)
	leaseCtx, stopLease := context.WithCancel(ctx)
	leaseWatched := make(chan error, 1)
	go func() {
		leaseWatched <- fabricapi.WatchLease(leaseCtx, fabric, namespace, ha.LeaseName, func(h string) { holders <- h })
	}()
	defer func() { stopLease(); <-leaseWatched }()
	holder := ha.NewIdentity("gw2")
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: ha.LeaseName, Namespace: namespace}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
	if _, err := cp.Client.CoordinationV1().Leases(namespace).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer cp.Client.CoordinationV1().Leases(namespace).Delete(context.Background(), ha.LeaseName, metav1.DeleteOptions{})
	for h := ""; h != holder; {
		select {
		case h = <-holders:
		case err := <-leaseWatched:
			t.Fatalf("fabric watches the Lease: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatalf("the fabric's token did not see the Lease held by %s in 30 s", holder)
		}
	}
	if moved, ok := plan.WithGatewayOf(holder); ok {
		t.Errorf("a plan that follows no Lease moved to %s", moved.GatewayNode)
	}

	if gone, err := fabricapi.Uninstalling(ctx, fabric, namespace); err != nil || gone {
		t.Errorf("Uninstalling with the DaemonSet in place: %v, %v; want false", gone, err)
	}
	patch := []byte(`{"data":{"plan.json":"{}"}}`)
	for what, err := range map[string]error{
		"patch the plan": func() error {
			_, err := fabric.CoreV1().ConfigMaps(namespace).Patch(ctx, fabricapi.PlanName, types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		}(),
		"list configmaps": func() error {
			_, err := fabric.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{})
			return err
		}(),
		"list nodes": func() error { _, err := fabric.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); return err }(),
		"take the Lease": func() error {
			l, err := fabric.CoordinationV1().Leases(namespace).Get(ctx, ha.LeaseName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			l.Spec.HolderIdentity = ptr.To(ha.NewIdentity("worker"))
			_, err = fabric.CoordinationV1().Leases(namespace).Update(ctx, l, metav1.UpdateOptions{})
			return err
		}(),
		"list leases": func() error {
			_, err := fabric.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{})
			return err
		}(),
		"delete its DaemonSet":        fabric.AppsV1().DaemonSets(namespace).Delete(ctx, fabricapi.DaemonSetName, metav1.DeleteOptions{}),
		"agent deletes the DaemonSet": agent.AppsV1().DaemonSets(namespace).Delete(ctx, fabricapi.DaemonSetName, metav1.DeleteOptions{}),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", what, err)
		}
	}

	// The DaemonSet deleted: a stopping fabric pod removes its node's part.
	// The publisher stops first, as with the agent uninstalled: its
	// periodic re-apply would otherwise put the DaemonSet back.
	stopPublisher()
	if err := cp.Client.AppsV1().DaemonSets(namespace).Delete(ctx, fabricapi.DaemonSetName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 30*time.Second, "Uninstalling once the DaemonSet is gone", func() error {
		gone, err := fabricapi.Uninstalling(ctx, fabric, namespace)
		if err != nil {
			return err
		}
		if !gone {
			return errors.New("Uninstalling says false")
		}
		return nil
	})
}
