package ctrl

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

// Watch is a kind an informer of a cache holds and the handler of its
// events.
type Watch struct {
	Object  client.Object
	Handler toolscache.ResourceEventHandler
}

// On is the Watch of obj's kind by h.
func On(obj client.Object, h toolscache.ResourceEventHandler) Watch {
	return Watch{Object: obj, Handler: h}
}

// AddWatches adds each handler to the informer of its kind in c and
// returns their registrations, for StartCache; what names the component
// in errors.
func AddWatches(ctx context.Context, c cache.Informers, what string, watches ...Watch) ([]toolscache.ResourceEventHandlerRegistration, error) {
	regs := make([]toolscache.ResourceEventHandlerRegistration, 0, len(watches))
	for _, w := range watches {
		inf, err := c.GetInformer(ctx, w.Object)
		if err != nil {
			return nil, fmt.Errorf("%s: watch %T: %w", what, w.Object, err)
		}
		reg, err := inf.AddEventHandler(w.Handler)
		if err != nil {
			return nil, fmt.Errorf("%s: watch %T: %w", what, w.Object, err)
		}
		regs = append(regs, reg)
	}
	return regs, nil
}

// StartCache runs c on wg and returns once every handler of regs (with
// none, every informer of c) has seen all of c's objects: no reconcile
// decides on part of the picture, where an object not read yet looks
// unwanted. synced is false when ctx ended or c stopped first; err is
// then c's error, naming what. cacheErr is for Controller.Run.
func StartCache(ctx context.Context, wg *sync.WaitGroup, c cache.Cache, what string, regs ...toolscache.ResourceEventHandlerRegistration) (cacheErr <-chan error, synced bool, err error) {
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

// OnEvery calls f with the object of every add, update (the new one) and
// delete, a deletion's last known state unwrapped, if it is a T: a
// handler that queues what an object is about, whatever happened to it.
func OnEvery[T any](f func(obj T)) toolscache.ResourceEventHandler {
	g := func(obj any) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if o, ok := obj.(T); ok {
			f(o)
		}
	}
	return toolscache.ResourceEventHandlerFuncs{AddFunc: g, UpdateFunc: func(_, obj any) { g(obj) }, DeleteFunc: g}
}

// Start is what a controller's workers need before their first
// reconcile: the cache they read from, the handlers of its kinds'
// events, and what runs beside them.
type Start struct {
	// What names the controller in errors.
	What  string
	Cache cache.Cache
	// Watches are handlers of kinds of Cache; every one has seen all
	// of its kind's objects before Synced runs.
	Watches []Watch
	// Synced runs once the watches synced, before the workers start:
	// what to queue first, what to start beside them (on wg, which Run
	// waits for). An error ends Run with it.
	Synced func(ctx context.Context, wg *sync.WaitGroup) error
	// Stopped runs once the workers, the cache and everything on wg have
	// ended: what outlives them (watches of other API servers) stops.
	Stopped func()
}

// RunWithCache is a controller's start-up and shutdown: it adds
// s.Watches to s.Cache, starts the cache and waits until the watches
// have seen all of its objects (no reconcile decides on part of the
// picture, where an object not read yet looks unwanted), runs s.Synced,
// then the workers until ctx ends or the cache stops with an error. It
// returns once everything it started has ended, and s.Stopped has run.
func (c *Controller[K]) RunWithCache(ctx context.Context, s Start) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		c.queue.ShutDown()
		wg.Wait()
		if s.Stopped != nil {
			s.Stopped()
		}
	}()
	regs, err := AddWatches(ctx, s.Cache, s.What, s.Watches...)
	if err != nil {
		return err
	}
	cacheErr, synced, err := StartCache(ctx, &wg, s.Cache, s.What, regs...)
	if !synced {
		return err
	}
	if s.Synced != nil {
		if err := s.Synced(ctx, &wg); err != nil {
			return err
		}
	}
	return c.Run(ctx, cacheErr)
}
