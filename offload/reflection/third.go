package reflection

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/flotilla-io/flotilla/offload"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Endpoints on third clusters, the consumer's side (docs/services.md,
// "Endpoints on third clusters"). An endpoint of a local slice on a pod
// this cluster offloaded to provider B is listed here in this cluster's
// view of B; provider P needs P's view of B, which only P's agent knows.
// So this cluster writes such endpoints to P in B's own addresses
// (ToRemote), one slice per local slice and third cluster, named by
// LabelEndpointsOf and without kubernetes.io/service-name: P's
// kube-proxy ignores it until P's agent has translated it
// (hosted.go).

// thirdAddresses are e's addresses in the own terms of the third cluster
// it runs on, for provider t.provider; ok is false when e is not on a
// third cluster's virtual node or an address is outside this cluster's
// view of it.
func (t endpointTranslator) thirdAddresses(e discoveryv1.Endpoint) (cluster string, addrs []string, ok bool) {
	if e.NodeName == nil {
		return "", nil, false
	}
	cluster = providerOfNode(*e.NodeName)
	if cluster == "" || cluster == t.provider || len(e.Addresses) == 0 {
		return "", nil, false
	}
	for _, a := range e.Addresses {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return "", nil, false
		}
		remote, ok := t.views.ToRemote(cluster, ip)
		if !ok {
			return "", nil, false
		}
		addrs = append(addrs, remote.String())
	}
	return cluster, addrs, true
}

// thirdClusterSlices are the slices that carry local's endpoints on third
// clusters to t.provider, by name: one per third cluster, in its own
// addresses, marked as reflected from local (its origin) and with the
// Service's name in LabelServiceName. Endpoints whose addresses cannot be
// handed on are left out here and counted by reflectedSlice.
func thirdClusterSlices(local *discoveryv1.EndpointSlice, namespace string, t endpointTranslator) map[string]*discoveryv1.EndpointSlice {
	out := map[string]*discoveryv1.EndpointSlice{}
	for _, e := range local.Endpoints {
		cluster, addrs, ok := t.thirdAddresses(e)
		if !ok {
			continue
		}
		name := thirdSliceName(local.Name, cluster)
		s := out[name]
		if s == nil {
			s = &discoveryv1.EndpointSlice{ObjectMeta: reflectedMeta(local, namespace), AddressType: local.AddressType}
			s.Name = name
			svc := s.Labels[discoveryv1.LabelServiceName]
			delete(s.Labels, discoveryv1.LabelServiceName)
			s.Labels[offload.LabelServiceName] = svc
			s.Labels[offload.LabelEndpointsOf] = cluster
			s.Labels[discoveryv1.LabelManagedBy] = offload.ReflectionManagedBy
			s.Ports = make([]discoveryv1.EndpointPort, 0, len(local.Ports))
			for _, p := range local.Ports {
				s.Ports = append(s.Ports, *p.DeepCopy())
			}
			s.Endpoints = []discoveryv1.Endpoint{}
			out[name] = s
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses: addrs, Conditions: *e.Conditions.DeepCopy(), Hostname: e.Hostname,
		})
	}
	return out
}

// thirdSliceName names the slice of local slice's endpoints on cluster.
func thirdSliceName(local, cluster string) string { return derivedName(local, cluster) }

// reconcileWithThird reconciles key, and for a slice the slices of its
// endpoints on third clusters too.
func (r *Reflector) reconcileWithThird(ctx context.Context, key reflectKey) (bool, error) {
	wrote, err := r.reconcile(ctx, key)
	if key.kind != kindEndpointSlice {
		return wrote, err
	}
	thirdWrote, thirdErr := r.reconcileThird(ctx, key)
	return wrote || thirdWrote, errors.Join(err, thirdErr)
}

// reconcileThird brings the third-cluster slices of key's local slice on
// key's provider in line: created, updated, and deleted when no endpoint
// of the slice runs on that cluster any more.
func (r *Reflector) reconcileThird(ctx context.Context, key reflectKey) (wrote bool, err error) {
	pp := r.provider(key.provider)
	if pp == nil {
		return false, nil
	}
	remoteNS := pp.remoteNamespace(key.namespace)
	rc := pp.cacheOf(remoteNS)
	if remoteNS == "" || rc == nil {
		return false, nil
	}
	want := map[string]*discoveryv1.EndpointSlice{}
	// The slice's own reflection decides whether it goes at all.
	main, _, err := r.desired(ctx, key, remoteNS)
	if err != nil {
		return false, err
	}
	if main != nil {
		var local discoveryv1.EndpointSlice
		switch err := r.local.Get(ctx, client.ObjectKey{Namespace: key.namespace, Name: key.name}, &local); {
		case err == nil:
			want = thirdClusterSlices(&local, remoteNS, endpointTranslator{provider: key.provider, views: r.cfg.Views})
		case !apierrors.IsNotFound(err):
			return false, fmt.Errorf("read EndpointSlice %s/%s here: %w", key.namespace, key.name, err)
		}
	}
	var there discoveryv1.EndpointSliceList
	if err := rc.List(ctx, &there, client.InNamespace(remoteNS), client.HasLabels{offload.LabelEndpointsOf}); err != nil {
		return false, fmt.Errorf("list third-cluster slices in %s on %s: %w", remoteNS, pp.id, err)
	}
	current := map[string]*discoveryv1.EndpointSlice{}
	for i := range there.Items {
		s := &there.Items[i]
		if ns, name, ok := reflectedOrigin(s); ok && ns == key.namespace && name == key.name {
			current[s.Name] = s
		}
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(want)) {
		w, c := want[name], current[name]
		if c == nil {
			ok, err := r.createThird(ctx, pp, key, w)
			wrote = wrote || ok
			errs = append(errs, err)
			continue
		}
		updated, changed := merged(c, w)
		if !changed {
			continue
		}
		switch err := pp.client.Update(ctx, updated, client.FieldOwner(reflectFieldManager)); {
		case err == nil:
			wrote = true
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			errs = append(errs, offload.RetryLater(fmt.Sprintf("update EndpointSlice %s/%s on %s: the watch is behind: %v", remoteNS, name, pp.id, err)))
		default:
			errs = append(errs, r.failed(pp, key, "update", err))
		}
	}
	for name, c := range current {
		if want[name] != nil {
			continue
		}
		ok, err := r.deleteRemote(ctx, pp, key, c)
		wrote = wrote || ok
		errs = append(errs, err)
	}
	return wrote, errors.Join(errs...)
}

// createThird creates w; an object of its name that is not this slice's
// is left alone, counted and retried after the backoff.
func (r *Reflector) createThird(ctx context.Context, pp *reflectProvider, key reflectKey, w *discoveryv1.EndpointSlice) (bool, error) {
	err := pp.client.Create(ctx, w, client.FieldOwner(reflectFieldManager))
	switch {
	case err == nil:
		return true, nil
	case !apierrors.IsAlreadyExists(err):
		return false, r.failed(pp, key, "create", err)
	}
	var there discoveryv1.EndpointSlice
	if err := pp.client.Get(ctx, client.ObjectKeyFromObject(w), &there); err != nil {
		return false, offload.RetryLater(fmt.Sprintf("create EndpointSlice %s/%s on %s: it existed, then: %v", w.Namespace, w.Name, pp.id, err))
	}
	if ns, name, ok := reflectedOrigin(&there); ok && ns == key.namespace && name == key.name {
		return false, offload.RetryLater(fmt.Sprintf("EndpointSlice %s/%s on %s is ours and the watch is behind", w.Namespace, w.Name, pp.id))
	}
	r.m.errors.WithLabelValues(kindEndpointSlice, pp.id, offload.ErrNameTaken).Inc()
	return false, offload.RetryLater(fmt.Sprintf("EndpointSlice %s/%s on %s, for the endpoints of %s/%s on %s, is not this cluster's: left alone",
		w.Namespace, w.Name, pp.id, key.namespace, key.name, w.Labels[offload.LabelEndpointsOf]))
}
