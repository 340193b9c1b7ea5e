package offload

import (
	"context"
	"fmt"
	"sync"
)

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
