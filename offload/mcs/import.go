package mcs

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
)

// Who imports an export (docs/services.md): cluster S's export of
// namespace/name is imported into this cluster's namespace L when
//   - S is this cluster and L is the namespace (the KEP: an exporter
//     imports its own Service too);
//   - L has the export's name and is not a namespace mirrored for a
//     consumer (namespace sameness);
//   - L is mirrored here for consumer S (offload.LabelTenant S) from S's
//     namespace of the export's name (v1alpha1.LabelMirroredFrom): the
//     pods S offloads here reach the Services S exports.

// sourcesFor are the exports held that import into local namespace ns as
// name.
func (s *Services) sourcesFor(ns *corev1.Namespace, name string) []Source {
	tenant, from := ns.Labels[offload.LabelTenant], ns.Labels[v1alpha1.LabelMirroredFrom]
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Source
	for c, snap := range s.snapshots {
		want := ns.Name
		switch {
		case c == s.self:
		case tenant == "":
		case tenant == c && from != "":
			want = from
		default:
			continue
		}
		for _, e := range snap.Exports {
			if e.Namespace == want && e.Name == name {
				out = append(out, Source{Cluster: c, Export: e})
			}
		}
	}
	slices.SortFunc(out, func(a, b Source) int { return strings.Compare(a.Cluster, b.Cluster) })
	return out
}

// enqueueChanged queues every import that cluster's exports, old and
// new, may touch here.
func (s *Services) enqueueChanged(cluster string, old, cur []Export) {
	names := map[key]bool{}
	for _, e := range slices.Concat(old, cur) {
		names[key{e.Namespace, e.Name}] = true
		s.exports.Add(key{e.Namespace, e.Name}) // a conflict may have changed
	}
	var mirrored []corev1.Namespace
	if cluster != s.self {
		var list corev1.NamespaceList
		if err := s.cache.List(context.Background(), &list, client.MatchingLabels{offload.LabelTenant: cluster}); err == nil {
			mirrored = list.Items
		}
	}
	for k := range names {
		s.imports.Add(k)
		for _, ns := range mirrored {
			if ns.Labels[v1alpha1.LabelMirroredFrom] == k.Namespace {
				s.imports.Add(key{ns.Name, k.Name})
			}
		}
	}
}

// enqueueNamespace queues every import a namespace's coming, going or
// labels change.
func (s *Services) enqueueNamespace(ns *corev1.Namespace) {
	from := ns.Labels[v1alpha1.LabelMirroredFrom]
	s.mu.Lock()
	var names []string
	for _, snap := range s.snapshots {
		for _, e := range snap.Exports {
			if e.Namespace == ns.Name || (from != "" && e.Namespace == from) {
				names = append(names, e.Name)
			}
		}
	}
	s.mu.Unlock()
	for _, n := range names {
		s.imports.Add(key{ns.Name, n})
	}
}

// enqueueImportOf queues the import an object of the importer's belongs
// to: someone changing or deleting it gets it put back.
func (s *Services) enqueueImportOf(o any) {
	obj, ok := o.(client.Object)
	if !ok {
		return
	}
	switch obj.(type) {
	case *mcsv1alpha1.ServiceImport:
		s.imports.Add(key{obj.GetNamespace(), obj.GetName()})
	default:
		if n := obj.GetLabels()[LabelServiceName]; n != "" {
			s.imports.Add(key{obj.GetNamespace(), n})
		}
	}
}

// enqueueExistingImports queues the imports written before a restart, so
// that one whose export is gone goes too (after Grace).
func (s *Services) enqueueExistingImports(ctx context.Context) error {
	var list mcsv1alpha1.ServiceImportList
	if err := s.cache.List(ctx, &list, client.MatchingLabels{LabelManagedBy: ManagedBy}); err != nil {
		return fmt.Errorf("mcs: list ServiceImports: %w", err)
	}
	for _, si := range list.Items {
		s.imports.Add(key{si.Namespace, si.Name})
	}
	return nil
}

// reconcileImport makes the ServiceImport k, its derived Service and its
// EndpointSlices what the exports held say; with none, removes them. It
// returns a time to look again when it waits for a source to be heard.
func (s *Services) reconcileImport(ctx context.Context, k key) (time.Duration, error) {
	var si mcsv1alpha1.ServiceImport
	exists := true
	if err := s.cache.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: k.Name}, &si); err != nil {
		if !apierrors.IsNotFound(err) {
			return 0, err
		}
		exists = false
	}
	if exists && si.Labels[LabelManagedBy] != ManagedBy {
		s.foreignImport(k)
		return 0, nil
	}
	var sources []Source
	var ns corev1.Namespace
	if err := s.cache.Get(ctx, client.ObjectKey{Name: k.Namespace}, &ns); err == nil && ns.DeletionTimestamp == nil {
		sources = s.sourcesFor(&ns, k.Name)
	} else if !apierrors.IsNotFound(err) && err != nil {
		return 0, err
	}
	if len(sources) == 0 {
		if !exists {
			return 0, nil
		}
		if wait := s.unheard(&si); wait > 0 {
			return wait, nil
		}
		s.log.Info("import removed: no cluster exports it any more", "import", k)
		return 0, s.removeImport(ctx, &si)
	}
	return 0, s.writeImport(ctx, k, exists, &si, sources)
}

// unheard is how long to keep an import after a start while a cluster
// it lists has not sent its exports yet; 0: remove it now.
func (s *Services) unheard(si *mcsv1alpha1.ServiceImport) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	left := s.cfg.Grace - s.cfg.Now().Sub(s.started)
	if left <= 0 {
		return 0
	}
	for _, c := range si.Status.Clusters {
		if _, heard := s.snapshots[c.Cluster]; !heard && !(c.Cluster == s.self && s.exported) {
			return left
		}
	}
	return 0
}

func (s *Services) foreignImport(k key) {
	s.mu.Lock()
	logged := s.foreign[k]
	s.foreign[k] = true
	s.mu.Unlock()
	if !logged {
		s.log.Warn("a ServiceImport not written by Flotilla has the name of an import; it is left alone and nothing is imported there",
			"import", k)
	}
}

// removeImport deletes the ServiceImport, its derived Service and its
// slices; the garbage collector would too (they are owned), but not as
// soon.
func (s *Services) removeImport(ctx context.Context, si *mcsv1alpha1.ServiceImport) error {
	if err := s.syncSlices(ctx, si, nil, nil); err != nil {
		return err
	}
	if err := s.removeDerived(ctx, si.Namespace, si.Name); err != nil {
		return err
	}
	return client.IgnoreNotFound(s.c.Delete(ctx, si, client.Preconditions{UID: &si.UID}))
}

func (s *Services) removeDerived(ctx context.Context, ns, name string) error {
	var svc corev1.Service
	if err := s.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: DerivedServiceName(name)}, &svc); err != nil {
		return client.IgnoreNotFound(err)
	}
	if svc.Labels[LabelManagedBy] != ManagedBy {
		return nil
	}
	return client.IgnoreNotFound(s.c.Delete(ctx, &svc, client.Preconditions{UID: &svc.UID}))
}

// writeImport writes the ServiceImport, then (ClusterSetIP) the derived
// Service whose ClusterIP is the ClusterSetIP, then the slices, then the
// ServiceImport's spec with its ClusterSetIPs, then the status. The
// ClusterSetIPs come after the slices because the clusterset DNS answers
// a name once they are there: by then kube-proxy has been given the
// endpoints as well as the Service (programming them is its own sync,
// which it holds at least its minSyncPeriod, 1 s by default, after the
// Service's).
func (s *Services) writeImport(ctx context.Context, k key, exists bool, si *mcsv1alpha1.ServiceImport, sources []Source) error {
	r := Resolve(sources)
	spec := mcsv1alpha1.ServiceImportSpec{Type: mcsv1alpha1.ServiceImportType(r.Type),
		SessionAffinity: corev1.ServiceAffinity(r.SessionAffinity), Ports: []mcsv1alpha1.ServicePort{}}
	if r.AffinityTimeout > 0 {
		t := r.AffinityTimeout
		spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &t}}
	}
	for _, p := range r.Ports {
		sp := mcsv1alpha1.ServicePort{Name: p.Name, Protocol: corev1.Protocol(p.Protocol), Port: p.Port}
		if p.AppProtocol != "" {
			sp.AppProtocol = &p.AppProtocol
		}
		spec.Ports = append(spec.Ports, sp)
	}
	if r.InternalTrafficPolicy != "" {
		p := corev1.ServiceInternalTrafficPolicy(r.InternalTrafficPolicy)
		spec.InternalTrafficPolicy = &p
	}
	if r.TrafficDistribution != "" {
		d := r.TrafficDistribution
		spec.TrafficDistribution = &d
	}
	if !exists {
		*si = mcsv1alpha1.ServiceImport{
			ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name, Labels: map[string]string{LabelManagedBy: ManagedBy}},
			Spec:       spec,
		}
		applyExported(&si.ObjectMeta, r.Labels, r.Annotations)
		if err := s.c.Create(ctx, si); err != nil {
			return fmt.Errorf("create ServiceImport %s: %w", k, err)
		}
	}
	if r.Type == TypeClusterSetIP {
		derived, err := s.ensureDerived(ctx, si, r)
		if err != nil {
			return err
		}
		// One ClusterSetIP per IP family, in the derived Service's order.
		if derived.Spec.ClusterIP != "" && len(derived.Spec.ClusterIPs) == len(derived.Spec.IPFamilies) {
			spec.IPs, spec.IPFamilies = slices.Clone(derived.Spec.ClusterIPs), slices.Clone(derived.Spec.IPFamilies)
		}
	} else {
		spec.IPFamilies = endpointFamilies(sources)
		if err := s.removeDerived(ctx, k.Namespace, k.Name); err != nil {
			return err
		}
	}
	if err := s.syncSlices(ctx, si, sources, r.Ports); err != nil {
		return err
	}
	relabelled := applyExported(&si.ObjectMeta, r.Labels, r.Annotations)
	if relabelled || !reflect.DeepEqual(si.Spec, spec) {
		si.Spec = spec
		if err := s.c.Update(ctx, si); err != nil {
			return fmt.Errorf("update ServiceImport %s: %w", k, err)
		}
	}
	return s.writeImportStatus(ctx, si, sources, r)
}

// endpointFamilies are the IP families of a headless import, which has
// no ClusterSetIP to take them from: those of the exports' endpoints,
// IPv4 first; with no endpoint yet, IPv4, the one family the tunnels
// carry between clusters.
func endpointFamilies(sources []Source) []corev1.IPFamily {
	var v4, v6 bool
	for _, src := range sources {
		for _, sl := range src.Export.Slices {
			for _, e := range sl.Endpoints {
				for _, a := range e.Addresses {
					if a.Unmap().Is4() {
						v4 = true
					} else {
						v6 = true
					}
				}
			}
		}
	}
	var out []corev1.IPFamily
	if v4 || !v6 {
		out = append(out, corev1.IPv4Protocol)
	}
	if v6 {
		out = append(out, corev1.IPv6Protocol)
	}
	return out
}

// ensureDerived creates or updates the derived Service of si and returns
// it.
func (s *Services) ensureDerived(ctx context.Context, si *mcsv1alpha1.ServiceImport, r Resolution) (*corev1.Service, error) {
	name := DerivedServiceName(si.Name)
	var ports []corev1.ServicePort
	for _, p := range r.Ports {
		sp := corev1.ServicePort{Name: p.Name, Protocol: corev1.Protocol(p.Protocol), Port: p.Port, TargetPort: intstr.FromInt32(p.Port)}
		if p.AppProtocol != "" {
			sp.AppProtocol = &p.AppProtocol
		}
		ports = append(ports, sp)
	}
	affinity := corev1.ServiceAffinity(r.SessionAffinity)
	var affinityCfg *corev1.SessionAffinityConfig
	if affinity == corev1.ServiceAffinityClientIP && r.AffinityTimeout > 0 {
		t := r.AffinityTimeout
		affinityCfg = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &t}}
	}
	// Unset in the exports, the API server's defaults stand.
	var itp *corev1.ServiceInternalTrafficPolicy
	if r.InternalTrafficPolicy != "" {
		p := corev1.ServiceInternalTrafficPolicy(r.InternalTrafficPolicy)
		itp = &p
	}
	var td *string
	if r.TrafficDistribution != "" {
		td = &r.TrafficDistribution
	}
	var svc corev1.Service
	err := s.cache.Get(ctx, client.ObjectKey{Namespace: si.Namespace, Name: name}, &svc)
	switch {
	case apierrors.IsNotFound(err):
		svc = corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: si.Namespace, Name: name,
				Labels: map[string]string{LabelManagedBy: ManagedBy, LabelServiceName: si.Name}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: ports, SessionAffinity: affinity, SessionAffinityConfig: affinityCfg,
				InternalTrafficPolicy: itp, TrafficDistribution: td},
		}
		if err := controllerutil.SetControllerReference(si, &svc, s.c.Scheme()); err != nil {
			return nil, err
		}
		if err := s.c.Create(ctx, &svc); err != nil {
			return nil, fmt.Errorf("create the derived Service %s/%s: %w", si.Namespace, name, err)
		}
		return &svc, nil
	case err != nil:
		return nil, err
	case svc.Labels[LabelManagedBy] != ManagedBy:
		return nil, fmt.Errorf("a Service %s/%s not written by Flotilla is in the way of the import's derived Service; rename or delete it", si.Namespace, name)
	}
	if !reflect.DeepEqual(svc.Spec.Ports, ports) || svc.Spec.SessionAffinity != affinity ||
		(itp != nil && !reflect.DeepEqual(svc.Spec.InternalTrafficPolicy, itp)) || !reflect.DeepEqual(svc.Spec.TrafficDistribution, td) {
		svc.Spec.Ports, svc.Spec.SessionAffinity, svc.Spec.SessionAffinityConfig = ports, affinity, affinityCfg
		svc.Spec.TrafficDistribution = td
		if itp != nil {
			svc.Spec.InternalTrafficPolicy = itp
		}
		if err := s.c.Update(ctx, &svc); err != nil {
			return nil, fmt.Errorf("update the derived Service %s/%s: %w", si.Namespace, name, err)
		}
	}
	return &svc, nil
}

// syncSlices makes si's EndpointSlices one per exported slice of each
// source, addresses translated into this cluster's views of the source,
// and only the ports the import holds (held, the resolution's).
func (s *Services) syncSlices(ctx context.Context, si *mcsv1alpha1.ServiceImport, sources []Source, held []Port) error {
	want := map[string]*discoveryv1.EndpointSlice{}
	for _, src := range sources {
		dropped := portsLeftOut(src.Export.Ports, held)
		for i, sl := range src.Export.Slices {
			es := s.sliceOf(si, src.Cluster, i, sl, dropped)
			want[es.Name] = es
		}
	}
	var have discoveryv1.EndpointSliceList
	if err := s.cache.List(ctx, &have, client.InNamespace(si.Namespace),
		client.MatchingLabels{LabelServiceName: si.Name, discoveryv1.LabelManagedBy: ManagedBy}); err != nil {
		return err
	}
	for i := range have.Items {
		cur := &have.Items[i]
		w, ok := want[cur.Name]
		if !ok {
			if err := s.c.Delete(ctx, cur, client.Preconditions{UID: &cur.UID}); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("delete EndpointSlice %s/%s: %w", cur.Namespace, cur.Name, err)
			}
			continue
		}
		delete(want, cur.Name)
		if cur.AddressType == w.AddressType && reflect.DeepEqual(cur.Endpoints, w.Endpoints) && reflect.DeepEqual(cur.Ports, w.Ports) &&
			reflect.DeepEqual(cur.Labels, w.Labels) {
			continue
		}
		if cur.AddressType != w.AddressType { // immutable
			if err := s.c.Delete(ctx, cur); client.IgnoreNotFound(err) != nil {
				return err
			}
			want[w.Name] = w
			continue
		}
		cur.Endpoints, cur.Ports, cur.Labels = w.Endpoints, w.Ports, w.Labels
		if err := s.c.Update(ctx, cur); err != nil {
			return fmt.Errorf("update EndpointSlice %s/%s: %w", cur.Namespace, cur.Name, err)
		}
	}
	for _, w := range want {
		if err := s.c.Create(ctx, w); err != nil {
			return fmt.Errorf("create EndpointSlice %s/%s: %w", w.Namespace, w.Name, err)
		}
	}
	return nil
}

// portsLeftOut names the ports of an export that the import does not
// hold (they clash with an older export's: the same name, or the same
// number and protocol). Its endpoints do not serve them: kube-proxy
// matches a Service port to an endpoint port by name, and would send
// the older export's port to this export's port of that name.
func portsLeftOut(own, held []Port) map[string]bool {
	out := map[string]bool{}
	for _, p := range own {
		if !slices.Contains(held, p) {
			out[p.Name] = true
		}
	}
	return out
}

// sliceOf is the EndpointSlice for the index-th slice of cluster's
// export: this cluster's own addresses as they are, another's translated
// by the views, an address no view covers left out and counted; the
// ports in dropped (portsLeftOut) left out.
func (s *Services) sliceOf(si *mcsv1alpha1.ServiceImport, cluster string, index int, sl Slice, dropped map[string]bool) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: si.Namespace, Name: ImportedSliceName(si.Name, cluster, index),
			Labels: map[string]string{
				LabelServiceName: si.Name, LabelSourceCluster: cluster,
				discoveryv1.LabelServiceName: DerivedServiceName(si.Name), discoveryv1.LabelManagedBy: ManagedBy,
			}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{},
		Ports:       []discoveryv1.EndpointPort{},
	}
	_ = controllerutil.SetOwnerReference(si, es, s.c.Scheme())
	for _, p := range sl.Ports {
		if dropped[p.Name] {
			continue
		}
		ep := discoveryv1.EndpointPort{Name: &p.Name, Port: &p.Port, Protocol: (*corev1.Protocol)(&p.Protocol)}
		if p.AppProtocol != "" {
			ep.AppProtocol = &p.AppProtocol
		}
		es.Ports = append(es.Ports, ep)
	}
	family := ""
	for _, ep := range sl.Endpoints {
		out := discoveryv1.Endpoint{Conditions: discoveryv1.EndpointConditions{Ready: ptr(ep.Ready), Serving: ptr(ep.Serving), Terminating: ptr(false)}}
		if ep.Hostname != "" {
			out.Hostname = ptr(ep.Hostname)
		} else if len(ep.Addresses) > 0 {
			// KEP-1645's system-assigned identifier of an endpoint without
			// a hostname: its address as the exporter knows it, dashed,
			// so that every importer names it alike whatever its view.
			out.Hostname = ptr(AddressLabel(ep.Addresses[0]))
		}
		for _, a := range ep.Addresses {
			local, ok := a, true
			if cluster != s.self {
				local, ok = s.cfg.Views.Translate(cluster, a)
			}
			if !ok {
				s.metrics.untranslatable.Inc()
				continue
			}
			f := familyOf(local)
			if family == "" {
				family = f
			}
			if f != family { // a slice holds one family
				continue
			}
			out.Addresses = append(out.Addresses, local.String())
		}
		if len(out.Addresses) > 0 {
			es.Endpoints = append(es.Endpoints, out)
		}
	}
	if family == string(discoveryv1.AddressTypeIPv6) {
		es.AddressType = discoveryv1.AddressTypeIPv6
	}
	return es
}

func familyOf(a netip.Addr) string {
	if a.Unmap().Is4() {
		return string(discoveryv1.AddressTypeIPv4)
	}
	return string(discoveryv1.AddressTypeIPv6)
}

func ptr[T any](v T) *T { return &v }

// writeImportStatus writes the clusters and the conditions a person
// reads: Valid, Ready (a ClusterSetIP import once its IP is allocated),
// Conflict (per the KEP).
func (s *Services) writeImportStatus(ctx context.Context, si *mcsv1alpha1.ServiceImport, sources []Source, r Resolution) error {
	st := mcsv1alpha1.ServiceImportStatus{Conditions: slices.Clone(si.Status.Conditions)}
	for _, src := range sources {
		st.Clusters = append(st.Clusters, mcsv1alpha1.ClusterStatus{Cluster: src.Cluster})
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: ImportConditionValid, Status: metav1.ConditionTrue, Reason: "Valid",
		Message: fmt.Sprintf("imported from %d cluster(s)", len(sources)), ObservedGeneration: si.Generation})
	ready := metav1.Condition{Type: string(mcsv1alpha1.ServiceImportConditionReady), Status: metav1.ConditionTrue,
		Reason: string(mcsv1alpha1.ServiceImportReasonReady), Message: "the import serves its endpoints", ObservedGeneration: si.Generation}
	if r.Type == TypeClusterSetIP && len(si.Spec.IPs) == 0 {
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, string(mcsv1alpha1.ServiceImportReasonPending), "the derived Service has no ClusterIP yet"
	}
	meta.SetStatusCondition(&st.Conditions, ready)
	conflict := metav1.Condition{Type: ImportConditionConflict, Status: metav1.ConditionFalse, Reason: "NoConflicts",
		Message: "the exports agree", ObservedGeneration: si.Generation}
	if len(r.Conflicts) > 0 {
		var msgs []string
		for _, c := range r.Conflicts {
			msgs = append(msgs, c.Message)
		}
		conflict.Status, conflict.Reason, conflict.Message = metav1.ConditionTrue, r.Conflicts[0].Reason, strings.Join(msgs, "; ")
	}
	meta.SetStatusCondition(&st.Conditions, conflict)
	if reflect.DeepEqual(st.Clusters, si.Status.Clusters) && reflect.DeepEqual(st.Conditions, si.Status.Conditions) {
		return nil
	}
	si.Status.Clusters, si.Status.Conditions = st.Clusters, st.Conditions
	if err := s.c.Status().Update(ctx, si); err != nil {
		return fmt.Errorf("update the status of ServiceImport %s/%s: %w", si.Namespace, si.Name, err)
	}
	return nil
}
