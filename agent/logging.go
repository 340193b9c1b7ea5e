package agent

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// kubernetesLogs is the one handler controller-runtime and client-go
// (klog) log through. Both keep one logger per process and take it once
// (controller-runtime ignores a second SetLogger), so the handler forwards
// to the agent that started last: tests start several in one process.
var kubernetesLogs = struct {
	once   sync.Once
	target atomic.Pointer[slog.Handler]
}{}

// RouteKubernetesLogs sends the Kubernetes libraries' logs to log, tagged
// component=kubernetes. Without it controller-runtime prints a stack trace
// ("log.SetLogger(...) was never called") and drops its messages, and klog
// writes its own format to stderr. Their verbosity V(n) is slog level -n:
// V(0) is info, V(4) debug.
func RouteKubernetesLogs(log *slog.Logger) {
	h := log.With("component", "kubernetes").Handler()
	kubernetesLogs.target.Store(&h)
	kubernetesLogs.once.Do(func() {
		l := logr.FromSlogHandler(forwardingHandler{})
		ctrllog.SetLogger(l)
		// Contextual: client-go's klog.FromContext gets our logger, whose
		// level decides, rather than klog's own -v flag.
		klog.SetLoggerWithOptions(l, klog.ContextualLogger(true))
	})
}

// forwardingHandler hands records to the current target, after the
// attributes and groups added to it on the way.
type forwardingHandler struct {
	with []func(slog.Handler) slog.Handler
}

func (f forwardingHandler) handler() slog.Handler {
	h := *kubernetesLogs.target.Load()
	for _, w := range f.with {
		h = w(h)
	}
	return h
}

func (f forwardingHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return f.handler().Enabled(ctx, l)
}

func (f forwardingHandler) Handle(ctx context.Context, r slog.Record) error {
	return f.handler().Handle(ctx, r)
}

func (f forwardingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return f.add(func(h slog.Handler) slog.Handler { return h.WithAttrs(attrs) })
}

func (f forwardingHandler) WithGroup(name string) slog.Handler {
	return f.add(func(h slog.Handler) slog.Handler { return h.WithGroup(name) })
}

func (f forwardingHandler) add(w func(slog.Handler) slog.Handler) forwardingHandler {
	return forwardingHandler{with: append(append([]func(slog.Handler) slog.Handler{}, f.with...), w)}
}
