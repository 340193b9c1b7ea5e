package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// components owns everything the agent starts: goroutines and closers,
// kept in start order and stopped in reverse. It is ours rather than an
// errgroup because an errgroup cancels one context for all at once and
// its Wait cannot be bounded; the agent must stop discovery before the
// engine, the engine before the tunnel and the ledger last, within the
// shutdown timeout, and say which one hung. controller-runtime's manager
// starts Runnables by group, not in one order, and stops them together.
type components struct {
	log *slog.Logger
	// fail is called once with the first component that ends on its own.
	fail func(error)

	mu    sync.Mutex
	stack []*component
}

// component is one entry of the stack: a goroutine with its own context,
// or a closer, or both.
type component struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{} // closed when run returned; nil without a goroutine
	close  func() error
}

func newComponents(log *slog.Logger, fail func(error)) *components {
	return &components{log: log, fail: fail}
}

// Go runs run in a goroutine of its own until Stop cancels its context.
// run returning before that, with an error or without, is a failure of the
// agent: fail learns it, naming the component.
func (c *components) Go(name string, run func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	comp := &component{name: name, cancel: cancel, done: make(chan struct{})}
	c.push(comp)
	go func() {
		defer close(comp.done)
		err := run(ctx)
		if ctx.Err() != nil {
			if err != nil && !errors.Is(err, context.Canceled) {
				c.log.Warn("component stopped with an error", "component", name, "err", err)
			}
			return
		}
		if err == nil {
			err = errors.New("stopped on its own")
		}
		c.fail(fmt.Errorf("%s: %w", name, err))
	}()
}

// OnStop registers close to run when Stop reaches it: after the components
// registered later have stopped, before those registered earlier.
func (c *components) OnStop(name string, close func() error) {
	c.push(&component{name: name, close: close})
}

func (c *components) push(comp *component) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stack = append(c.stack, comp)
}

// Stop stops every component in reverse order, each within what is left
// of ctx. A component still running at the deadline is named in the error;
// the ones below it are cancelled but not waited for, and their closers do
// not run: the process is about to exit, and closing the ledger under a
// running engine would be worse than leaving it to the kernel.
func (c *components) Stop(ctx context.Context) error {
	c.mu.Lock()
	stack := c.stack
	c.stack = nil
	c.mu.Unlock()
	for i := len(stack) - 1; i >= 0; i-- {
		comp := stack[i]
		if err := comp.stop(ctx, c.log); err != nil {
			var left []string
			for j := i - 1; j >= 0; j-- {
				if stack[j].cancel != nil {
					stack[j].cancel()
				}
				left = append(left, stack[j].name)
			}
			if len(left) > 0 {
				err = fmt.Errorf("%w; not stopped: %s", err, strings.Join(left, ", "))
			}
			return err
		}
	}
	return nil
}

func (comp *component) stop(ctx context.Context, log *slog.Logger) error {
	if comp.cancel != nil {
		comp.cancel()
		select {
		case <-comp.done:
		case <-ctx.Done():
			return fmt.Errorf("%s did not stop in time", comp.name)
		}
	}
	if comp.close == nil {
		return nil
	}
	closed := make(chan error, 1)
	go func() { closed <- comp.close() }()
	select {
	case err := <-closed:
		if err != nil {
			log.Warn("component did not close cleanly", "component", comp.name, "err", err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s did not close in time", comp.name)
	}
}
