package offload

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// informerWatch is a kind an informer of a cache holds and the handler of its
// events.
type informerWatch struct {
	obj client.Object
	h   toolscache.ResourceEventHandler
}

// addWatches adds each handler to the informer of its kind in c and
// returns their registrations, for startCache; what names the component
// in errors.
func addWatches(ctx context.Context, c cache.Informers, what string, watches ...informerWatch) ([]toolscache.ResourceEventHandlerRegistration, error) {
	regs := make([]toolscache.ResourceEventHandlerRegistration, 0, len(watches))
	for _, w := range watches {
		inf, err := c.GetInformer(ctx, w.obj)
		if err != nil {
			return nil, fmt.Errorf("%s: watch %T: %w", what, w.obj, err)
		}
		reg, err := inf.AddEventHandler(w.h)
		if err != nil {
			return nil, fmt.Errorf("%s: watch %T: %w", what, w.obj, err)
		}
		regs = append(regs, reg)
	}
	return regs, nil
}

// startCache runs c on wg and returns once every handler of regs (with
// none, every informer of c) has seen all of c's objects: no reconcile
// decides on part of the picture, where an object not read yet looks
// unwanted. synced is false when ctx ended or c stopped first; err is
// then c's error, naming what. cacheErr is for work.
func startCache(ctx context.Context, wg *sync.WaitGroup, c cache.Cache, what string, regs ...toolscache.ResourceEventHandlerRegistration) (cacheErr <-chan error, synced bool, err error) {
	errc := make(chan error, 1)
	wg.Go(func() { errc <- c.Start(ctx) })
	if len(regs) == 0 {
		synced = c.WaitForCacheSync(ctx)
	} else {
		// client-go's own wait looks every 100 ms; a start waits on this.
		synced = wait.PollUntilContextCancel(ctx, 5*time.Millisecond, true, func(context.Context) (bool, error) {
			for _, r := range regs {
				if !r.HasSynced() {
					return false, nil
				}
			}
			return true, nil
		}) == nil
	}
	if synced {
		return errc, true, nil
	}
	select {
	case err := <-errc:
		if err != nil && ctx.Err() == nil {
			return errc, false, fmt.Errorf("%s: watch: %w", what, err)
		}
	default:
	}
	return errc, false, nil
}

// onEvery calls f with the object of every add, update (the new one) and
// delete, a deletion's last known state unwrapped: the handlers of this
// package queue what an object is about, whatever happened to it.
func onEvery(f func(obj any)) toolscache.ResourceEventHandler {
	g := func(obj any) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		f(obj)
	}
	return toolscache.ResourceEventHandlerFuncs{AddFunc: g, UpdateFunc: func(_, obj any) { g(obj) }, DeleteFunc: g}
}

// work runs n workers of next on wg until next says to stop, and returns
// when ctx ends (nil) or the cache the workers read from stops with an
// error (what names the controller in it). The controllers of this
// package share it: a work queue drained by bounded workers, fed by a
// cache that must keep running.
func work(ctx context.Context, wg *sync.WaitGroup, n int, next func(context.Context) bool, cacheErr <-chan error, what string) error {
	for range n {
		wg.Go(func() {
			for next(ctx) {
			}
		})
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-cacheErr:
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("%s: watch: %w", what, err)
		}
		return nil
	}
}
