package mcs

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/flotilla-io/flotilla/internal/ctrl"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
)

// watch registers the handlers: local exports and what they export wake
// the exporter; namespaces and the importer's own objects queue imports.
func (s *Services) watch(ctx context.Context) error {
	wakeExport := func(any) { s.wakeExporter() }
	for _, obj := range []client.Object{&mcsv1alpha1.ServiceExport{}, &corev1.Service{}, &discoveryv1.EndpointSlice{}} {
		inf, err := s.cache.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("mcs: watch %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(ctrl.OnEvery(func(o any) {
			if mine(o) {
				s.enqueueImportOf(o)
				return
			}
			wakeExport(o)
		})); err != nil {
			return err
		}
	}
	imports, err := s.cache.GetInformer(ctx, &mcsv1alpha1.ServiceImport{})
	if err != nil {
		return fmt.Errorf("mcs: watch ServiceImports: %w", err)
	}
	if _, err := imports.AddEventHandler(ctrl.OnEvery(s.enqueueImportOf)); err != nil {
		return err
	}
	namespaces, err := s.cache.GetInformer(ctx, &corev1.Namespace{})
	if err != nil {
		return fmt.Errorf("mcs: watch Namespaces: %w", err)
	}
	_, err = namespaces.AddEventHandler(ctrl.OnEvery(func(o any) {
		if ns, ok := o.(*corev1.Namespace); ok {
			s.enqueueNamespace(ns)
		}
	}))
	return err
}

// mine says whether the importer wrote o.
func mine(o any) bool {
	obj, ok := o.(client.Object)
	if !ok {
		return false
	}
	l := obj.GetLabels()
	return l[LabelManagedBy] == ManagedBy || l[discoveryv1.LabelManagedBy] == ManagedBy
}

func (s *Services) wakeExporter() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// exportLoop builds and sends this cluster's snapshot on every change
// (gathered for Debounce), sends it to peers that just connected, again
// to all every Resync, and withdraws the exports of peers gone too long.
func (s *Services) exportLoop(ctx context.Context) {
	resync := time.NewTicker(s.cfg.Resync)
	defer resync.Stop()
	sweep := time.NewTicker(max(s.cfg.Grace/4, 10*time.Millisecond))
	defer sweep.Stop()
	s.wakeExporter()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
			select {
			case <-ctx.Done():
				return
			case <-time.After(s.cfg.Debounce):
			}
			if err := s.export(ctx); err != nil {
				s.log.Error("exports not sent; retrying", "err", err)
				time.AfterFunc(time.Second, s.wakeExporter)
			}
		case peer := <-s.connect:
			s.sendTo(ctx, []string{peer})
		case <-resync.C:
			s.sendTo(ctx, s.connectedPeers())
		case <-sweep.C:
			for _, c := range s.expired(s.cfg.Now()) {
				s.withdraw(c)
			}
		}
	}
}

// export builds the snapshot of this cluster's exports; when it differs
// from the last, it is signed at a new serial and sent to every Connected
// peer, and imported here too (the KEP: an exporter imports its own).
func (s *Services) export(ctx context.Context) error {
	exports, err := s.buildExports(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	old := s.snapshots[s.self]
	same := s.exported && reflect.DeepEqual(old.Exports, exports)
	s.mu.Unlock()
	if same {
		return nil
	}
	serial, err := s.nextSerial()
	if err != nil {
		return err
	}
	snap := Snapshot{Cluster: s.self, Serial: serial, Exports: exports}
	msgs, err := Encode(s.cfg.Identity, snap, s.cfg.MaxMessageLen)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.snapshots[s.self] = snap
	s.exported = true
	s.messages, s.serial = msgs, serial
	s.mu.Unlock()
	s.enqueueChanged(s.self, old.Exports, exports)
	s.sendTo(ctx, s.connectedPeers())
	return nil
}

// sendTo sends the current snapshot to peers, at once; a failure waits
// for the next resync.
func (s *Services) sendTo(ctx context.Context, peers []string) {
	s.mu.Lock()
	msgs := s.messages
	s.mu.Unlock()
	if len(msgs) == 0 || len(peers) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Go(func() {
			for _, m := range msgs {
				if err := s.cfg.Send(ctx, p, m); err != nil {
					s.log.Debug("exports not sent to a peer; the next resync tries again", "peer", p, "err", err)
					return
				}
			}
			s.metrics.sent.Inc()
		})
	}
	wg.Wait()
}

// buildExports reads every ServiceExport here and what it exports; an
// export whose Service is missing or of type ExternalName is left out
// (its condition Valid says why).
func (s *Services) buildExports(ctx context.Context) ([]Export, error) {
	var list mcsv1alpha1.ServiceExportList
	if err := s.cache.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("list ServiceExports: %w", err)
	}
	var out []Export
	for i := range list.Items {
		se := &list.Items[i]
		s.exports.Add(key{se.Namespace, se.Name})
		if se.DeletionTimestamp != nil {
			continue
		}
		var svc corev1.Service
		if err := s.cache.Get(ctx, client.ObjectKey{Namespace: se.Namespace, Name: se.Name}, &svc); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("read Service %s/%s: %w", se.Namespace, se.Name, err)
		}
		if !Exportable(&svc) {
			continue
		}
		e, err := s.exportOf(ctx, se, &svc)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Export) int {
		if a.Key() < b.Key() {
			return -1
		}
		if a.Key() > b.Key() {
			return 1
		}
		return 0
	})
	return out, nil
}

func (s *Services) exportOf(ctx context.Context, se *mcsv1alpha1.ServiceExport, svc *corev1.Service) (Export, error) {
	e := Export{Namespace: se.Namespace, Name: se.Name, Type: TypeClusterSetIP, Created: se.CreationTimestamp.UTC(),
		SessionAffinity: string(svc.Spec.SessionAffinity),
		Labels:          exportedMeta(se.Spec.ExportedLabels, true), Annotations: exportedMeta(se.Spec.ExportedAnnotations, false)}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		e.Type = TypeHeadless
	}
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		e.AffinityTimeout = *c.ClientIP.TimeoutSeconds
	}
	for _, p := range svc.Spec.Ports {
		e.Ports = append(e.Ports, Port{Name: p.Name, Protocol: string(p.Protocol), AppProtocol: deref(p.AppProtocol), Port: p.Port})
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil {
		e.InternalTrafficPolicy = string(*p)
	}
	e.TrafficDistribution = deref(svc.Spec.TrafficDistribution)
	var slicesList discoveryv1.EndpointSliceList
	if err := s.cache.List(ctx, &slicesList, client.InNamespace(se.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: se.Name}); err != nil {
		return Export{}, fmt.Errorf("list EndpointSlices of %s/%s: %w", se.Namespace, se.Name, err)
	}
	items := slicesList.Items
	slices.SortFunc(items, func(a, b discoveryv1.EndpointSlice) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	for _, es := range items {
		if !ExportsSlice(&es) {
			continue
		}
		sl := Slice{}
		for _, p := range es.Ports {
			if p.Port == nil {
				continue
			}
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			sl.Ports = append(sl.Ports, Port{Name: deref(p.Name), Protocol: string(proto), AppProtocol: deref(p.AppProtocol), Port: *p.Port})
		}
		for _, ep := range es.Endpoints {
			out := Endpoint{Ready: ep.Conditions.Ready == nil || *ep.Conditions.Ready,
				Serving: ep.Conditions.Serving == nil || *ep.Conditions.Serving, Hostname: deref(ep.Hostname)}
			for _, a := range ep.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil {
					out.Addresses = append(out.Addresses, ip)
				}
			}
			if len(out.Addresses) > 0 {
				sl.Endpoints = append(sl.Endpoints, out)
			}
		}
		e.Slices = append(e.Slices, sl)
	}
	return e, nil
}

// Exportable reports whether the Service of a ServiceExport (not being
// deleted) is exported: every type but ExternalName. The agent's traffic
// policy allows every Segregated peer what an exported Service's slices
// hold.
func Exportable(svc *corev1.Service) bool {
	return svc.Spec.Type != corev1.ServiceTypeExternalName
}

// ExportsSlice reports whether an EndpointSlice of an exported Service is
// exported with it: not one the importer made, not of FQDNs.
func ExportsSlice(es *discoveryv1.EndpointSlice) bool {
	return es.Labels[discoveryv1.LabelManagedBy] != ManagedBy && es.AddressType != discoveryv1.AddressTypeFQDN
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// exportStatus writes one ServiceExport's conditions: Valid (its Service
// exists and is not ExternalName) and Conflict (as the snapshots of the
// clusters exporting the same Service say).
func (s *Services) exportStatus(ctx context.Context, k key) error {
	var se mcsv1alpha1.ServiceExport
	if err := s.cache.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: k.Name}, &se); err != nil {
		return client.IgnoreNotFound(err)
	}
	conds := slices.Clone(se.Status.Conditions)
	valid := metav1.Condition{Type: mcsv1alpha1.ServiceExportValid, Status: metav1.ConditionTrue,
		Reason: string(mcsv1alpha1.ServiceExportReasonValid), Message: "the Service is exported to every Connected peer", ObservedGeneration: se.Generation}
	var svc corev1.Service
	switch err := s.cache.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: k.Name}, &svc); {
	case apierrors.IsNotFound(err):
		valid.Status, valid.Reason, valid.Message = metav1.ConditionFalse, string(mcsv1alpha1.ServiceExportReasonNoService), "no Service "+k.Name+" in this namespace: create it to export it"
	case err != nil:
		return err
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		valid.Status, valid.Reason, valid.Message = metav1.ConditionFalse, string(mcsv1alpha1.ServiceExportReasonInvalidServiceType), "a Service of type ExternalName cannot be exported"
	}
	meta.SetStatusCondition(&conds, valid)
	conflict := metav1.Condition{Type: mcsv1alpha1.ServiceExportConflict, Status: metav1.ConditionFalse,
		Reason: string(mcsv1alpha1.ServiceExportReasonNoConflicts), Message: "no export of the same Service in another cluster differs from this one", ObservedGeneration: se.Generation}
	if sources := s.sourcesByName(k); len(sources) > 0 {
		if c, lost := Resolve(sources).ConflictOf(s.self); lost {
			conflict.Status, conflict.Reason, conflict.Message = metav1.ConditionTrue, c.Reason, c.Message
		}
	}
	meta.SetStatusCondition(&conds, conflict)
	if reflect.DeepEqual(conds, se.Status.Conditions) {
		return nil
	}
	se.Status.Conditions = conds
	return client.IgnoreNotFound(s.c.Status().Update(ctx, &se))
}

// sourcesByName are the exports held of namespace/name, in every cluster
// by the same names (namespace sameness): what an exporter compares its
// own export with.
func (s *Services) sourcesByName(k key) []Source {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Source
	for c, snap := range s.snapshots {
		for _, e := range snap.Exports {
			if e.Namespace == k.Namespace && e.Name == k.Name {
				out = append(out, Source{Cluster: c, Export: e})
			}
		}
	}
	return out
}
