// Package ctrl is the one controller loop of the project's Kubernetes
// controllers: a rate-limited work queue, whose metrics reach /metrics,
// drained by a fixed number of workers that reconcile one key at a time
// and log an error once per change.
//
// A controller says how to reconcile one key; everything around that
// (backoff per key, requeueing after a delay, shutting the queue down
// in order, counting passes) is here, once.
package ctrl

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// Queue is a controller's work queue.
type Queue[K comparable] = workqueue.TypedRateLimitingInterface[K]

// Config is what a controller is made of.
type Config[K comparable] struct {
	// Name names the controller in metrics (the queue's name label and
	// the controller label) and in errors: lower case, underscores.
	Name string
	// Workers reconcile keys at once; 0 means 1. A key is never
	// reconciled by two workers at a time.
	Workers int
	// BaseDelay and MaxDelay bound the backoff of a key whose reconcile
	// failed, doubling from one to the other (defaults 100 ms and 1
	// minute).
	BaseDelay, MaxDelay time.Duration
	// RateLimiter, when set, decides when a failed key is queued again
	// instead of BaseDelay and MaxDelay: a queue that also bounds its
	// retries overall (a bucket limiter beside the backoff per key).
	RateLimiter workqueue.TypedRateLimiter[K]
	// Reconcile acts on key. An error queues it again after its
	// backoff; otherwise a positive after queues it again then.
	Reconcile func(ctx context.Context, key K) (after time.Duration, err error)
	// Errors logs a key's error once per change; nil logs nothing.
	Errors *ErrorLog[K]
	// Failed is told of each failed reconcile, for a controller's own
	// counters; nil is fine.
	Failed func(key K, err error)
	// Metrics registers the queue's and the loop's metrics; nil
	// registers none.
	Metrics prometheus.Registerer
}

// Controller is a work queue and the workers that drain it.
type Controller[K comparable] struct {
	cfg    Config[K]
	queue  Queue[K]
	passes *passMetrics
}

// New makes a controller whose queue takes keys at once; Run starts
// its workers.
func New[K comparable](cfg Config[K]) (*Controller[K], error) {
	if cfg.Name == "" || cfg.Reconcile == nil {
		return nil, fmt.Errorf("controller %q: a name and a reconcile are required", cfg.Name)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.BaseDelay <= 0 {
		cfg.BaseDelay = 100 * time.Millisecond
	}
	if cfg.MaxDelay <= 0 {
		cfg.MaxDelay = time.Minute
	}
	m, err := metricsOf(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("controller %s: metrics: %w", cfg.Name, err)
	}
	qc := workqueue.TypedRateLimitingQueueConfig[K]{Name: cfg.Name}
	if m != nil {
		qc.MetricsProvider = m.queues
	}
	limiter := cfg.RateLimiter
	if limiter == nil {
		limiter = workqueue.NewTypedItemExponentialFailureRateLimiter[K](cfg.BaseDelay, cfg.MaxDelay)
	}
	return &Controller[K]{
		cfg:    cfg,
		queue:  workqueue.NewTypedRateLimitingQueueWithConfig(limiter, qc),
		passes: m.of(cfg.Name),
	}, nil
}

// Queue is the controller's queue, for event handlers to add keys to.
func (c *Controller[K]) Queue() Queue[K] { return c.queue }

// Add queues key.
func (c *Controller[K]) Add(key K) { c.queue.Add(key) }

// Run runs the workers until ctx ends (it returns nil) or the cache the
// workers read from stops with an error (cacheErr, nil if there is
// none to watch), then ends the workers' context, shuts the queue down
// and returns once every worker has.
func (c *Controller[K]) Run(ctx context.Context, cacheErr <-chan error) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		c.queue.ShutDown()
		wg.Wait()
	}()
	for range c.cfg.Workers {
		wg.Go(func() {
			for c.next(ctx) {
			}
		})
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-cacheErr:
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("%s: watch: %w", c.cfg.Name, err)
		}
		return nil
	}
}

// next reconciles the next key; false once the queue is shut down.
func (c *Controller[K]) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	start := time.Now()
	after, err := c.cfg.Reconcile(ctx, key)
	if ctx.Err() != nil {
		// Stopping: what failed is the context, not the key.
		return true
	}
	c.passes.observe(time.Since(start), err)
	c.cfg.Errors.Note(key, err)
	switch {
	case err != nil:
		if c.cfg.Failed != nil {
			c.cfg.Failed(key, err)
		}
		c.queue.AddRateLimited(key)
	case after > 0:
		c.queue.Forget(key)
		c.queue.AddAfter(key, after)
	default:
		c.queue.Forget(key)
	}
	return true
}

// WithoutDelay is a reconcile that never asks to be queued again after
// a delay, as Config.Reconcile.
func WithoutDelay[K comparable](reconcile func(ctx context.Context, key K) error) func(context.Context, K) (time.Duration, error) {
	return func(ctx context.Context, key K) (time.Duration, error) { return 0, reconcile(ctx, key) }
}
