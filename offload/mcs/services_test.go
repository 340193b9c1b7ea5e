package mcs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	aboutv1alpha1 "github.com/flotilla-io/flotilla/api/about/v1alpha1"
	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/peering"
)

// imported is what a user of cluster c sees of an import.
type imported struct {
	si        mcsv1alpha1.ServiceImport
	clusterIP string
	// addrs by source cluster, sorted.
	addrs map[string][]string
}

func (c *cluster) imported(ns, name string) (imported, error) {
	ctx := context.Background()
	var out imported
	if err := c.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &out.si); err != nil {
		return out, err
	}
	if out.si.Spec.Type == mcsv1alpha1.ClusterSetIP {
		var svc corev1.Service
		if err := c.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: DerivedServiceName(name)}, &svc); err != nil {
			return out, fmt.Errorf("derived Service: %w", err)
		}
		out.clusterIP = svc.Spec.ClusterIP
	}
	var list discoveryv1.EndpointSliceList
	if err := c.admin.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{LabelServiceName: name}); err != nil {
		return out, err
	}
	out.addrs = map[string][]string{}
	for _, es := range list.Items {
		if es.Labels[discoveryv1.LabelServiceName] != DerivedServiceName(name) || es.Labels[discoveryv1.LabelManagedBy] != ManagedBy {
			return out, fmt.Errorf("slice %s labelled %v", es.Name, es.Labels)
		}
		src := es.Labels[LabelSourceCluster]
		for _, ep := range es.Endpoints {
			out.addrs[src] = append(out.addrs[src], ep.Addresses...)
		}
		slices.Sort(out.addrs[src])
	}
	return out, nil
}

// usable checks that the import is one a client can use: ClusterSetIP
// with the derived Service's IP in spec.ips, Ready, from the given
// clusters with the given addresses.
func (im imported) usable(want map[string][]string) error {
	if im.si.Spec.Type == mcsv1alpha1.ClusterSetIP && (im.clusterIP == "" || !slices.Equal(im.si.Spec.IPs, []string{im.clusterIP})) {
		return fmt.Errorf("spec.ips %v, derived Service's ClusterIP %q", im.si.Spec.IPs, im.clusterIP)
	}
	if !meta.IsStatusConditionTrue(im.si.Status.Conditions, string(mcsv1alpha1.ServiceImportConditionReady)) {
		return fmt.Errorf("not Ready: %v", im.si.Status.Conditions)
	}
	var clusters []string
	for _, c := range im.si.Status.Clusters {
		clusters = append(clusters, c.Cluster)
	}
	var wantClusters []string
	for c := range want {
		wantClusters = append(wantClusters, c)
	}
	slices.Sort(wantClusters)
	if !slices.Equal(clusters, wantClusters) {
		return fmt.Errorf("status.clusters %v, want %v", clusters, wantClusters)
	}
	for c, addrs := range want {
		if !slices.Equal(im.addrs[c], addrs) {
			return fmt.Errorf("addresses from %s: %v, want %v", c, im.addrs[c], addrs)
		}
	}
	if len(im.addrs) != len(want) {
		return fmt.Errorf("slices from %d clusters, want %d", len(im.addrs), len(want))
	}
	return nil
}

// watchClusterSetIP watches c's ServiceImport ns/name until it first
// has a ClusterSetIP, then sends how many of its EndpointSlices the API
// server holds at that moment. A watch the API server ends is opened
// again (it then starts with the ServiceImport as it is).
func watchClusterSetIP(t *testing.T, c *cluster, ns, name string) <-chan int {
	t.Helper()
	w, err := client.NewWithWatch(c.cp.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	open := func() (watch.Interface, error) {
		return w.Watch(ctx, &mcsv1alpha1.ServiceImportList{}, client.InNamespace(ns), client.MatchingFields{"metadata.name": name})
	}
	first, err := open()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	out := make(chan int, 1)
	go func() {
		defer cancel()
		for wa := first; ; {
			for ev := range wa.ResultChan() {
				if si, ok := ev.Object.(*mcsv1alpha1.ServiceImport); ok && len(si.Spec.IPs) > 0 {
					wa.Stop()
					var list discoveryv1.EndpointSliceList
					if err := c.admin.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{LabelServiceName: name}); err != nil {
						t.Errorf("list %s's EndpointSlices of %s/%s: %v", c.name, ns, name, err)
					}
					out <- len(list.Items)
					return
				}
			}
			wa.Stop()
			var err error
			if err = ctx.Err(); err == nil {
				wa, err = open()
			}
			if err != nil {
				t.Errorf("%s's ServiceImport %s/%s had no ClusterSetIP within a minute: %v", c.name, ns, name, err)
				out <- -1
				return
			}
		}
	}()
	return out
}

func condition(conds []metav1.Condition, t string) metav1.Condition {
	if c := meta.FindStatusCondition(conds, t); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// TestExportImport runs the Multi-Cluster Services API across three real
// control planes, their exports carried by an in-memory bus.
func TestExportImport(t *testing.T) {
	f, cs := newFederation(t, "a", "b", "c")
	top := t // a restarted controller runs until the whole test ends
	a, b, c := cs[0], cs[1], cs[2]
	B, C := b.id.ClusterID(), c.id.ClusterID()
	ctx := context.Background()
	for _, x := range cs {
		x.ensureNamespace(t, "web")
	}

	t.Run("export reaches the importer, translated", func(t *testing.T) {
		ipsFirstSeen := watchClusterSetIP(t, a, "web", "front")
		// 192.168.7.7 is covered by no view of b: left out in a.
		b.exportService(t, "web", "front", 80, "10.1.0.5", "10.1.0.6", "192.168.7.7")
		eventually.Within(t, time.Minute, "a imports b's front", func() error {
			im, err := a.imported("web", "front")
			if err != nil {
				return err
			}
			if err := im.usable(map[string][]string{B: {"10.201.0.5", "10.201.0.6"}}); err != nil {
				return err
			}
			if p := im.si.Spec.Ports; len(p) != 1 || p[0].Port != 80 || p[0].Protocol != corev1.ProtocolTCP {
				return fmt.Errorf("ports %v", p)
			}
			// One ClusterSetIP per IP family, as the derived Service has.
			spec := im.si.Spec
			if len(spec.IPs) == 0 || len(spec.IPs) != len(spec.IPFamilies) {
				return fmt.Errorf("IPs %v, IP families %v: want one IP per family", spec.IPs, spec.IPFamilies)
			}
			for i, ip := range spec.IPs {
				if a, err := netip.ParseAddr(ip); err != nil || (a.Is4() != (spec.IPFamilies[i] == corev1.IPv4Protocol)) {
					return fmt.Errorf("IP %q is not of family %s", ip, spec.IPFamilies[i])
				}
			}
			// b's API server defaulted its Service's policy; it travels.
			if p := spec.InternalTrafficPolicy; p == nil || *p != corev1.ServiceInternalTrafficPolicyCluster {
				return fmt.Errorf("internal traffic policy %v, want the exported Service's Cluster", p)
			}
			return nil
		})
		// The clusterset DNS answers the name once the ServiceImport has
		// its ClusterSetIP: by then the endpoints are written, so a
		// client that connects at once is not refused.
		if n := <-ipsFirstSeen; n == 0 {
			t.Errorf("a's ServiceImport had its ClusterSetIP before its EndpointSlices were written")
		}
		// The exporter imports its own, its addresses as they are.
		eventually.Within(t, time.Minute, "b imports its own front", func() error {
			im, err := b.imported("web", "front")
			if err != nil {
				return err
			}
			return im.usable(map[string][]string{B: {"10.1.0.5", "10.1.0.6", "192.168.7.7"}})
		})
		eventually.Within(t, time.Minute, "b's export is Valid, without conflict", func() error {
			var se mcsv1alpha1.ServiceExport
			if err := b.admin.Get(ctx, client.ObjectKey{Namespace: "web", Name: "front"}, &se); err != nil {
				return err
			}
			if !meta.IsStatusConditionTrue(se.Status.Conditions, mcsv1alpha1.ServiceExportValid) ||
				!meta.IsStatusConditionFalse(se.Status.Conditions, mcsv1alpha1.ServiceExportConflict) {
				return fmt.Errorf("conditions %v", se.Status.Conditions)
			}
			return nil
		})
	})

	t.Run("endpoints follow", func(t *testing.T) {
		b.setEndpoints(t, "web", "front", "10.1.0.6", "10.1.0.9")
		eventually.Within(t, time.Minute, "a follows b's endpoints", func() error {
			im, err := a.imported("web", "front")
			if err != nil {
				return err
			}
			return im.usable(map[string][]string{B: {"10.201.0.6", "10.201.0.9"}})
		})
	})

	t.Run("exported labels and annotations reach the ServiceImport", func(t *testing.T) {
		setExported := func(labels, annotations map[string]string) {
			t.Helper()
			var se mcsv1alpha1.ServiceExport
			if err := b.admin.Get(ctx, client.ObjectKey{Namespace: "web", Name: "front"}, &se); err != nil {
				t.Fatal(err)
			}
			se.Spec.ExportedLabels, se.Spec.ExportedAnnotations = labels, annotations
			if err := b.admin.Update(ctx, &se); err != nil {
				t.Fatal(err)
			}
		}
		// A label of Kubernetes' domain is not the exporter's to give.
		setExported(map[string]string{"tier": "web", "app.kubernetes.io/part-of": "shop"}, map[string]string{"example.com/note": "hi"})
		eventually.Within(t, time.Minute, "a's ServiceImport carries b's exported labels and annotations", func() error {
			im, err := a.imported("web", "front")
			if err != nil {
				return err
			}
			l, an := im.si.Labels, im.si.Annotations
			if l["tier"] != "web" || an["example.com/note"] != "hi" {
				return fmt.Errorf("labels %v, annotations %v", l, an)
			}
			if _, ok := l["app.kubernetes.io/part-of"]; ok || l[LabelManagedBy] != ManagedBy {
				return fmt.Errorf("labels %v: a reserved label came through, or ours went", l)
			}
			return nil
		})
		setExported(nil, nil)
		eventually.Within(t, time.Minute, "a's ServiceImport without them once b exports none", func() error {
			im, err := a.imported("web", "front")
			if err != nil {
				return err
			}
			if _, ok := im.si.Labels["tier"]; ok {
				return fmt.Errorf("labels %v", im.si.Labels)
			}
			if _, ok := im.si.Annotations["example.com/note"]; ok {
				return fmt.Errorf("annotations %v", im.si.Annotations)
			}
			if im.si.Labels[LabelManagedBy] != ManagedBy {
				return fmt.Errorf("labels %v: ours went too", im.si.Labels)
			}
			return nil
		})
	})

	t.Run("forged and replayed snapshots change nothing", func(t *testing.T) {
		// c signs a snapshot claiming to be b's, without exports; and b's
		// own first snapshot comes again.
		forged, err := Encode(c.id, Snapshot{Cluster: B, Serial: 1 << 62}, 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		old, err := Encode(b.id, Snapshot{Cluster: B, Serial: 1}, 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		a.svcs.Receive(forged[0])
		a.svcs.Receive(old[0])
		eventually.Within(t, time.Minute, "both refused", func() error {
			if n := testutil.ToFloat64(a.svcs.metrics.rejected.WithLabelValues("bad_signature")); n != 1 {
				return fmt.Errorf("%v refused for a bad signature", n)
			}
			if n := testutil.ToFloat64(a.svcs.metrics.rejected.WithLabelValues("replay")); n < 1 {
				return fmt.Errorf("%v refused as replays", n)
			}
			return nil
		})
		// Witness: b's next change still arrives, and the import holds.
		b.setEndpoints(t, "web", "front", "10.1.0.6", "10.1.0.9", "10.1.0.10")
		eventually.Within(t, time.Minute, "a follows b's endpoints after the forgery", func() error {
			im, err := a.imported("web", "front")
			if err != nil {
				return err
			}
			return im.usable(map[string][]string{B: {"10.201.0.10", "10.201.0.6", "10.201.0.9"}})
		})
		b.setEndpoints(t, "web", "front", "10.1.0.6", "10.1.0.9")
	})

	t.Run("an export without its Service is not Valid", func(t *testing.T) {
		se := &mcsv1alpha1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "missing"}}
		if err := b.admin.Create(ctx, se); err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, time.Minute, "NoService", func() error {
			if err := b.admin.Get(ctx, client.ObjectKeyFromObject(se), se); err != nil {
				return err
			}
			if c := condition(se.Status.Conditions, mcsv1alpha1.ServiceExportValid); c.Status != metav1.ConditionFalse || c.Reason != "NoService" {
				return fmt.Errorf("Valid %+v", c)
			}
			return nil
		})
		if err := a.admin.Get(ctx, client.ObjectKey{Namespace: "web", Name: "missing"}, &mcsv1alpha1.ServiceImport{}); !apierrors.IsNotFound(err) {
			t.Errorf("a imports an export without a Service: %v", err)
		}
	})

	t.Run("a younger conflicting export loses", func(t *testing.T) {
		// Creation times have seconds: within b's second, the KEP's tie
		// rule (the lower cluster ID) would decide, not age.
		var bse mcsv1alpha1.ServiceExport
		if err := b.admin.Get(ctx, client.ObjectKey{Namespace: "web", Name: "front"}, &bse); err != nil {
			t.Fatal(err)
		}
		for !time.Now().Truncate(time.Second).After(bse.CreationTimestamp.Time) {
			time.Sleep(50 * time.Millisecond)
		}
		c.exportService(t, "web", "front", 81, "10.1.0.7")
		eventually.Within(t, time.Minute, "a shows the conflict", func() error {
			im, err := a.imported("web", "front")
			if err != nil {
				return err
			}
			if err := im.usable(map[string][]string{B: {"10.201.0.6", "10.201.0.9"}, C: {"10.202.0.7"}}); err != nil {
				return err
			}
			if cond := condition(im.si.Status.Conditions, ImportConditionConflict); cond.Status != metav1.ConditionTrue || cond.Reason != "PortConflict" {
				return fmt.Errorf("Conflict %+v", cond)
			}
			if p := im.si.Spec.Ports; len(p) != 1 || p[0].Port != 80 {
				var bse, cse mcsv1alpha1.ServiceExport
				_ = b.admin.Get(ctx, client.ObjectKey{Namespace: "web", Name: "front"}, &bse)
				_ = c.admin.Get(ctx, client.ObjectKey{Namespace: "web", Name: "front"}, &cse)
				a.svcs.mu.Lock()
				snapB, snapC := a.svcs.snapshots[B], a.svcs.snapshots[C]
				a.svcs.mu.Unlock()
				return fmt.Errorf("ports %v, want the oldest export's, 80 (b's export created %v, c's %v; a holds b %+v, c %+v)", p, bse.CreationTimestamp, cse.CreationTimestamp, snapB.Exports, snapC.Exports)
			}
			return nil
		})
		// c's endpoints serve no port of the import: kube-proxy would send
		// b's port http, 80, to c's port http, 81.
		eventually.Within(t, time.Minute, "a's slices of c without the clashing port", func() error {
			var list discoveryv1.EndpointSliceList
			if err := a.admin.List(ctx, &list, client.InNamespace("web"), client.MatchingLabels{LabelServiceName: "front"}); err != nil {
				return err
			}
			for _, es := range list.Items {
				from, n := es.Labels[LabelSourceCluster], len(es.Ports)
				if from == C && n != 0 || from == B && (n != 1 || es.Ports[0].Name == nil || *es.Ports[0].Name != "http") {
					return fmt.Errorf("slice %s from %s has ports %+v", es.Name, from, es.Ports)
				}
			}
			return nil
		})
		// Both exports are in the conflict (the KEP): c's lost, b's holds.
		eventually.Within(t, time.Minute, "both exports show the conflict", func() error {
			for _, x := range []struct {
				c    *cluster
				says string
			}{{c, "differs"}, {b, "the oldest export, which holds"}} {
				var se mcsv1alpha1.ServiceExport
				if err := x.c.admin.Get(ctx, client.ObjectKey{Namespace: "web", Name: "front"}, &se); err != nil {
					return err
				}
				cond := condition(se.Status.Conditions, mcsv1alpha1.ServiceExportConflict)
				if cond.Status != metav1.ConditionTrue || cond.Reason != "PortConflict" || !strings.Contains(cond.Message, x.says) {
					return fmt.Errorf("%s's Conflict %+v, want True PortConflict saying %q", x.c.name, cond, x.says)
				}
			}
			return nil
		})
	})

	t.Run("importer restart", func(t *testing.T) {
		before, err := a.imported("web", "front")
		if err != nil {
			t.Fatal(err)
		}
		a.stop()
		f.start(top, a)
		// A resync has come and gone: a has heard from b and c again.
		eventually.Within(t, time.Minute, "a hears from b and c again", func() error {
			a.svcs.mu.Lock()
			defer a.svcs.mu.Unlock()
			if _, ok := a.svcs.snapshots[B]; !ok {
				return fmt.Errorf("no snapshot of b")
			}
			if _, ok := a.svcs.snapshots[C]; !ok {
				return fmt.Errorf("no snapshot of c")
			}
			return nil
		})
		eventually.Within(t, time.Minute, "the same import, once", func() error {
			after, err := a.imported("web", "front")
			if err != nil {
				return err
			}
			if after.si.UID != before.si.UID || after.clusterIP != before.clusterIP {
				return fmt.Errorf("import replaced: uid %s->%s, ip %s->%s", before.si.UID, after.si.UID, before.clusterIP, after.clusterIP)
			}
			var list discoveryv1.EndpointSliceList
			if err := a.admin.List(ctx, &list, client.InNamespace("web"), client.MatchingLabels{LabelServiceName: "front"}); err != nil {
				return err
			}
			if len(list.Items) != 2 {
				return fmt.Errorf("%d slices, want 2 (one from b, one from c)", len(list.Items))
			}
			var sis mcsv1alpha1.ServiceImportList
			if err := a.admin.List(ctx, &sis, client.InNamespace("web")); err != nil {
				return err
			}
			if len(sis.Items) != 1 {
				return fmt.Errorf("%d ServiceImports", len(sis.Items))
			}
			return after.usable(map[string][]string{B: {"10.201.0.6", "10.201.0.9"}, C: {"10.202.0.7"}})
		})
	})

	t.Run("a foreign ServiceImport is left alone", func(t *testing.T) {
		foreign := &mcsv1alpha1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "api"},
			Spec: mcsv1alpha1.ServiceImportSpec{Type: mcsv1alpha1.Headless, Ports: []mcsv1alpha1.ServicePort{{Port: 1, Protocol: corev1.ProtocolUDP}}}}
		if err := a.admin.Create(ctx, foreign); err != nil {
			t.Fatal(err)
		}
		b.exportService(t, "web", "api", 80, "10.1.0.8")
		eventually.Within(t, time.Minute, "c imports b's api", func() error {
			im, err := c.imported("web", "api")
			if err != nil {
				return err
			}
			return im.usable(map[string][]string{B: {"10.201.0.8"}})
		})
		var got mcsv1alpha1.ServiceImport
		if err := a.admin.Get(ctx, client.ObjectKeyFromObject(foreign), &got); err != nil {
			t.Fatal(err)
		}
		if got.Spec.Type != mcsv1alpha1.Headless || len(got.Spec.Ports) != 1 || got.Spec.Ports[0].Port != 1 || len(got.Labels) != 0 || len(got.Status.Clusters) != 0 {
			t.Errorf("the foreign ServiceImport was touched: %+v", got)
		}
		if err := a.admin.Get(ctx, client.ObjectKey{Namespace: "web", Name: DerivedServiceName("api")}, &corev1.Service{}); !apierrors.IsNotFound(err) {
			t.Errorf("a derived Service for the foreign import: %v", err)
		}
	})

	t.Run("headless", func(t *testing.T) {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "db"},
			Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 5432}}}}
		if err := b.admin.Create(ctx, svc); err != nil {
			t.Fatal(err)
		}
		b.setEndpoints(t, "web", "db", "10.1.0.11")
		b.createExport(t, "web", "db")
		eventually.Within(t, time.Minute, "a imports b's headless db", func() error {
			im, err := a.imported("web", "db")
			if err != nil {
				return err
			}
			// No ClusterSetIP, but the family of the addresses it resolves to.
			if im.si.Spec.Type != mcsv1alpha1.Headless || len(im.si.Spec.IPs) != 0 || !slices.Equal(im.si.Spec.IPFamilies, []corev1.IPFamily{corev1.IPv4Protocol}) {
				return fmt.Errorf("type %s, ips %v, IP families %v", im.si.Spec.Type, im.si.Spec.IPs, im.si.Spec.IPFamilies)
			}
			return im.usable(map[string][]string{B: {"10.201.0.11"}})
		})
		// The endpoint has no hostname: every importer names it by b's
		// address, not by its own view of it. b imports its own export
		// too, in its own time: a's import is no witness of b's.
		for _, x := range []*cluster{a, b} {
			eventually.Within(t, time.Minute, x.name+"'s imported endpoints named by b's address", func() error {
				var list discoveryv1.EndpointSliceList
				if err := x.admin.List(ctx, &list, client.InNamespace("web"), client.MatchingLabels{LabelServiceName: "db"}); err != nil {
					return err
				}
				var names []string
				for _, es := range list.Items {
					for _, ep := range es.Endpoints {
						if ep.Hostname != nil {
							names = append(names, *ep.Hostname)
						}
					}
				}
				if !slices.Equal(names, []string{"10-1-0-11"}) {
					return fmt.Errorf("named %v, want [10-1-0-11]", names)
				}
				return nil
			})
		}
		if err := a.admin.Get(ctx, client.ObjectKey{Namespace: "web", Name: DerivedServiceName("db")}, &corev1.Service{}); !apierrors.IsNotFound(err) {
			t.Errorf("a headless import has a derived Service: %v", err)
		}
	})

	t.Run("a namespace mirrored for a consumer imports that consumer's exports only", func(t *testing.T) {
		// a hosts web of b as web-b (namespace offloading); c's export of
		// web/front is not b's, and stays out of it.
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "web-b",
			Labels: map[string]string{offload.LabelTenant: B, v1alpha1.LabelMirroredFrom: "web"}}}
		if err := a.admin.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, time.Minute, "a imports b's web/front into web-b", func() error {
			im, err := a.imported("web-b", "front")
			if err != nil {
				return err
			}
			if err := im.usable(map[string][]string{B: {"10.201.0.6", "10.201.0.9"}}); err != nil {
				return err
			}
			if cond := condition(im.si.Status.Conditions, ImportConditionConflict); cond.Status != metav1.ConditionFalse {
				return fmt.Errorf("Conflict %+v: c's export is not imported here", cond)
			}
			return nil
		})
	})

	t.Run("a peer gone longer than the grace is withdrawn", func(t *testing.T) {
		a.svcs.PeerChanged(peering.PeerState{ClusterID: C, IdentityKey: c.id.Public(), Phase: peering.PhaseUnreachable})
		eventually.Within(t, time.Minute, "c's endpoints leave a", func() error {
			im, err := a.imported("web", "front")
			if err != nil {
				return err
			}
			if err := im.usable(map[string][]string{B: {"10.201.0.6", "10.201.0.9"}}); err != nil {
				return err
			}
			if cond := condition(im.si.Status.Conditions, ImportConditionConflict); cond.Status != metav1.ConditionFalse {
				return fmt.Errorf("Conflict %+v", cond)
			}
			return nil
		})
		a.svcs.PeerChanged(peering.PeerState{ClusterID: C, IdentityKey: c.id.Public(), Phase: peering.PhaseConnected})
		eventually.Within(t, time.Minute, "c's endpoints are back once it is Connected again", func() error {
			im, err := a.imported("web", "front")
			if err != nil {
				return err
			}
			return im.usable(map[string][]string{B: {"10.201.0.6", "10.201.0.9"}, C: {"10.202.0.7"}})
		})
	})

	t.Run("cluster properties", func(t *testing.T) {
		// b's cluster ID was set by someone else before: left alone.
		other := &aboutv1alpha1.ClusterProperty{ObjectMeta: metav1.ObjectMeta{Name: ClusterIDProperty},
			Spec: aboutv1alpha1.ClusterPropertySpec{Value: "set-by-hand"}}
		if err := aboutClient(t, b).Create(ctx, other); err != nil {
			t.Fatal(err)
		}
		for _, x := range []*cluster{a, b} {
			p, err := NewClusterProperties(x.cp.Config, x.id.ClusterID(), "flotilla", nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for _, tt := range []struct {
			x           *cluster
			name, value string
		}{
			{a, ClusterIDProperty, a.id.ClusterID()},
			{a, ClusterSetProperty, "flotilla"},
			{b, ClusterIDProperty, "set-by-hand"},
			{b, ClusterSetProperty, "flotilla"},
		} {
			var cp aboutv1alpha1.ClusterProperty
			if err := aboutClient(t, tt.x).Get(ctx, client.ObjectKey{Name: tt.name}, &cp); err != nil {
				t.Fatalf("%s: %s: %v", tt.x.name, tt.name, err)
			}
			if cp.Spec.Value != tt.value {
				t.Errorf("%s: %s = %q, want %q", tt.x.name, tt.name, cp.Spec.Value, tt.value)
			}
		}
	})

	t.Run("an import stays while any cluster exports", func(t *testing.T) {
		before, err := a.imported("web", "front")
		if err != nil {
			t.Fatal(err)
		}
		var derived corev1.Service
		if err := a.admin.Get(ctx, client.ObjectKey{Namespace: "web", Name: DerivedServiceName("front")}, &derived); err != nil {
			t.Fatal(err)
		}
		// b's export, the oldest, which held the ports, goes; c's stays.
		if err := b.admin.Delete(ctx, &mcsv1alpha1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front"}}); err != nil {
			t.Fatal(err)
		}
		// The witness that a acted on b's unexport: b's endpoints gone.
		eventually.Within(t, time.Minute, "a's import of front from c alone", func() error {
			im, err := a.imported("web", "front")
			if err != nil {
				return err
			}
			return im.usable(map[string][]string{C: {"10.202.0.7"}})
		})
		// The same ServiceImport and derived Service, so the ClusterSetIP
		// clients hold stays.
		after, err := a.imported("web", "front")
		if err != nil {
			t.Fatal(err)
		}
		var derivedAfter corev1.Service
		if err := a.admin.Get(ctx, client.ObjectKey{Namespace: "web", Name: DerivedServiceName("front")}, &derivedAfter); err != nil {
			t.Fatal(err)
		}
		if after.si.UID != before.si.UID || derivedAfter.UID != derived.UID || !slices.Equal(after.si.Spec.IPs, before.si.Spec.IPs) {
			t.Errorf("ServiceImport %s, derived Service %s, ips %v after b's unexport; want %s, %s, %v as before",
				after.si.UID, derivedAfter.UID, after.si.Spec.IPs, before.si.UID, derived.UID, before.si.Spec.IPs)
		}
	})

	t.Run("unexport removes the import everywhere", func(t *testing.T) {
		for _, x := range []*cluster{b, c} {
			if err := x.admin.Delete(ctx, &mcsv1alpha1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front"}}); client.IgnoreNotFound(err) != nil {
				t.Fatal(err)
			}
		}
		for _, x := range cs {
			eventually.Within(t, time.Minute, "front gone from "+x.name, func() error {
				if err := x.admin.Get(ctx, client.ObjectKey{Namespace: "web", Name: "front"}, &mcsv1alpha1.ServiceImport{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("ServiceImport: %v", err)
				}
				if err := x.admin.Get(ctx, client.ObjectKey{Namespace: "web", Name: DerivedServiceName("front")}, &corev1.Service{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("derived Service: %v", err)
				}
				var list discoveryv1.EndpointSliceList
				if err := x.admin.List(ctx, &list, client.InNamespace("web"), client.MatchingLabels{LabelServiceName: "front"}); err != nil {
					return err
				}
				if len(list.Items) != 0 {
					return fmt.Errorf("%d slices left", len(list.Items))
				}
				return nil
			})
		}
		eventually.Within(t, time.Minute, "front gone from web-b in a", func() error {
			if err := a.admin.Get(ctx, client.ObjectKey{Namespace: "web-b", Name: "front"}, &mcsv1alpha1.ServiceImport{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("ServiceImport: %v", err)
			}
			return nil
		})
		// The exported Services themselves are the user's: untouched.
		if err := b.admin.Get(ctx, client.ObjectKey{Namespace: "web", Name: "front"}, &corev1.Service{}); err != nil {
			t.Errorf("b's Service: %v", err)
		}
	})
}

func aboutClient(t *testing.T, c *cluster) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := aboutv1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(c.cp.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
