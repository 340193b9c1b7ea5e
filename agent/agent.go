// Package agent wires a cluster's Flotilla agent together: configuration,
// the Kubernetes client, the components in their start order, and the
// health and metrics server.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config is what the agent needs to start. DefaultConfig fills it with
// values that work.
type Config struct {
	// Kubeconfig is the path of a kubeconfig file for the local cluster;
	// empty means the in-cluster service account.
	Kubeconfig string
	// StateDir holds the ledger (identity, keys, views). Created 0700.
	StateDir string
	// MetricsAddr serves /healthz, /readyz and /metrics; empty disables.
	MetricsAddr string
	// ShutdownTimeout bounds the stop of all components.
	ShutdownTimeout time.Duration
	Logger          *slog.Logger
}

// DefaultConfig returns the defaults of `flotilla agent`.
func DefaultConfig() Config {
	return Config{
		StateDir:        "/var/lib/flotilla",
		MetricsAddr:     ":9470",
		ShutdownTimeout: 4 * time.Second,
		Logger:          slog.Default(),
	}
}

// Agent is one cluster's agent.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	registry *prometheus.Registry
	ready    checks

	kube    kubernetes.Interface
	restCfg *rest.Config

	// listener is bound in New so that a bad address fails at once and
	// callers (tests) can learn the port when asked for ":0".
	listener net.Listener
}

// New validates cfg and prepares the agent; it starts nothing.
func New(cfg Config) (*Agent, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultConfig().ShutdownTimeout
	}
	if cfg.StateDir == "" {
		return nil, errors.New("state directory: empty; set --state-dir")
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", cfg.StateDir, err)
	}
	restCfg, err := kubeConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	restCfg.UserAgent = "flotilla-agent/" + Version
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, registry: newRegistry(), kube: kube, restCfg: restCfg}
	if cfg.MetricsAddr != "" {
		if a.listener, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
			return nil, fmt.Errorf("metrics address %s: %w", cfg.MetricsAddr, err)
		}
	}
	return a, nil
}

func kubeConfig(path string) (*rest.Config, error) {
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("no --kubeconfig given and not running in a pod (%w); pass --kubeconfig", err)
	}
	return cfg, nil
}

func newRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "flotilla_build_info",
			Help:        "Build of the running agent; always 1.",
			ConstLabels: prometheus.Labels{"version": Version, "commit": BuildCommit(), "goversion": runtime.Version()},
		}, func() float64 { return 1 }),
	)
	return r
}

// MetricsAddr returns the address the health and metrics server listens
// on, with the real port when ":0" was asked for.
func (a *Agent) MetricsAddr() string {
	if a.listener == nil {
		return ""
	}
	return a.listener.Addr().String()
}

// Run runs the agent until ctx is cancelled, then stops everything within
// ShutdownTimeout. It returns nil after a clean stop.
func (a *Agent) Run(ctx context.Context) error {
	a.log.Info("agent starting", "version", Version, "commit", BuildCommit(), "stateDir", a.cfg.StateDir, "apiServer", a.restCfg.Host)
	var srv *http.Server
	srvErr := make(chan error, 1)
	if a.listener != nil {
		srv = &http.Server{Handler: a.handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { srvErr <- srv.Serve(a.listener) }()
		a.log.Info("serving health and metrics", "addr", a.MetricsAddr())
	}

	a.ready.add("kubernetes", a.watchAPIServer(ctx))

	var err error
	select {
	case <-ctx.Done():
	case err = <-srvErr:
		err = fmt.Errorf("health and metrics server: %w", err)
	}
	a.log.Info("agent stopping")
	stopCtx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	if srv != nil {
		if serr := srv.Shutdown(stopCtx); serr != nil && err == nil {
			err = fmt.Errorf("stop health and metrics server: %w", serr)
		}
	}
	if err == nil {
		a.log.Info("agent stopped")
	}
	return err
}

func (a *Agent) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("/readyz", a.ready.serveReadyz)
	mux.Handle("/metrics", promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{Registry: a.registry}))
	return mux
}
