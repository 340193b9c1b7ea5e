package mcsdns

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/offload/mcs"
)

// crdRetry is how often the server looks again for the ServiceImport CRD
// when the cluster has none yet (the agent or an operator installs it).
const crdRetry = 5 * time.Second

// watch keeps the table current from the ServiceImports and
// EndpointSlices the agent imported, each change rebuilding the records
// of the one Service it is about.
func (s *Server) watch(ctx context.Context) error {
	// Stopped in reverse: the loop's workers (Run), then the cache and
	// the wait for it.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	c, regs, err := s.handlers(ctx, s.loop.Queue())
	if err != nil || regs == nil {
		return err // nil: ctx ended first
	}
	cacheErr, synced, err := ctrl.StartCache(ctx, &wg, c, "imports", regs...)
	if !synced {
		return err
	}
	// The zone opens once every ServiceImport read has its records: a
	// name answered NXDOMAIN only because it was not built yet would sit
	// in resolvers' caches.
	if err := s.firstPass(ctx, c); err != nil {
		return err
	}
	s.imported = c
	return s.loop.Run(ctx, cacheErr)
}

// newCache is the cache of the ServiceImports and EndpointSlices the
// agent imported. It fails while the cluster has no ServiceImport CRD.
func (s *Server) newCache() (cache.Cache, error) {
	scheme := runtime.NewScheme()
	if err := discoveryv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := mcsv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	// Only the slices an importer wrote: anyone who may create an
	// EndpointSlice in a namespace must not add answers to the zone.
	imported, err := labels.NewRequirement(mcs.LabelServiceName, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	ours, err := labels.NewRequirement(discoveryv1.LabelManagedBy, selection.Equals, []string{mcs.ManagedBy})
	if err != nil {
		return nil, err
	}
	// Likewise only our ServiceImports: a foreign one (another MCS
	// implementation's) has its own DNS, and blocks ours (offload/mcs).
	ourImports := labels.SelectorFromSet(labels.Set{mcs.LabelManagedBy: mcs.ManagedBy})
	return cache.New(s.cfg.Config, cache.Options{
		Scheme: scheme, DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&discoveryv1.EndpointSlice{}: {Label: labels.NewSelector().Add(*imported, *ours)},
			&mcsv1alpha1.ServiceImport{}: {Label: ourImports},
		},
	})
}

// handlers makes the cache and registers the queue with both its
// informers, once the cluster has the ServiceImport CRD; nil registrations
// when ctx ended first.
func (s *Server) handlers(ctx context.Context, queue ctrl.Queue[string]) (cache.Cache, []toolscache.ResourceEventHandlerRegistration, error) {
	var c cache.Cache
	var imports cache.Informer
	logged := false
	err := wait.PollUntilContextCancel(ctx, crdRetry, true, func(ctx context.Context) (bool, error) {
		var err error
		if c == nil {
			c, err = s.newCache()
		}
		if err == nil {
			imports, err = c.GetInformer(ctx, &mcsv1alpha1.ServiceImport{})
		}
		if err != nil {
			if !logged {
				s.log.Warn("cannot watch ServiceImports yet; the zone answers SERVFAIL until it can (is the ServiceImport CRD installed?)", "err", err)
				logged = true
			}
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return nil, nil, nil // ctx ended
	}
	slices, err := c.GetInformer(ctx, &discoveryv1.EndpointSlice{})
	if err != nil {
		return nil, nil, fmt.Errorf("watch EndpointSlices: %w", err)
	}
	r1, err := imports.AddEventHandler(ctrl.OnEvery(func(obj client.Object) {
		queue.Add(obj.GetNamespace() + "/" + obj.GetName())
	}))
	if err != nil {
		return nil, nil, fmt.Errorf("watch ServiceImports: %w", err)
	}
	r2, err := slices.AddEventHandler(ctrl.OnEvery(func(obj client.Object) {
		if name := obj.GetLabels()[mcs.LabelServiceName]; name != "" {
			queue.Add(obj.GetNamespace() + "/" + name)
		}
	}))
	if err != nil {
		return nil, nil, fmt.Errorf("watch EndpointSlices: %w", err)
	}
	return c, []toolscache.ResourceEventHandlerRegistration{r1, r2}, nil
}

// firstPass builds the records of every ServiceImport, then opens the
// zone. The queue holds them too, from the lists: built again, the same.
func (s *Server) firstPass(ctx context.Context, c client.Reader) error {
	var imports mcsv1alpha1.ServiceImportList
	if err := c.List(ctx, &imports); err != nil {
		return fmt.Errorf("list ServiceImports: %w", err)
	}
	for _, imp := range imports.Items {
		key := imp.Namespace + "/" + imp.Name
		if err := s.rebuild(ctx, c, key); err != nil {
			return fmt.Errorf("records of %s: %w", key, err)
		}
	}
	close(s.synced)
	s.log.Info("clusterset zone ready", "services", len(imports.Items))
	return nil
}

func (s *Server) rebuild(ctx context.Context, c client.Reader, key string) error {
	nn, ok := splitKey(key)
	if !ok {
		return nil
	}
	var imp mcsv1alpha1.ServiceImport
	if err := c.Get(ctx, nn, &imp); err != nil {
		if apierrors.IsNotFound(err) {
			s.zone.set(key, nil)
			return nil
		}
		return fmt.Errorf("read ServiceImport: %w", err)
	}
	var list discoveryv1.EndpointSliceList
	if err := c.List(ctx, &list, client.InNamespace(nn.Namespace), client.MatchingLabels{mcs.LabelServiceName: nn.Name}); err != nil {
		return fmt.Errorf("list EndpointSlices: %w", err)
	}
	eps := make([]*discoveryv1.EndpointSlice, len(list.Items))
	for i := range list.Items {
		eps[i] = &list.Items[i]
	}
	s.zone.set(key, buildService(&imp, eps))
	return nil
}

func splitKey(key string) (types.NamespacedName, bool) {
	ns, name, ok := strings.Cut(key, "/")
	return types.NamespacedName{Namespace: ns, Name: name}, ok && ns != "" && name != ""
}
