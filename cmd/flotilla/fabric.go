//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/flotilla-io/flotilla/agent"
	"github.com/flotilla-io/flotilla/fabric"
	"github.com/flotilla-io/flotilla/fabric/fabricapi"
	"github.com/flotilla-io/flotilla/internal/apiauth"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/observe/trace"
	"github.com/flotilla-io/flotilla/observe/trace/live"
)

func init() { register(newFabricCommand) }

func newFabricCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "fabric",
		GroupID: groupNode,
		Short:   "route this node's traffic to and from the peers (run by the agent's DaemonSet)",
		Args:    noArgs,
	}
	fs := cmd.Flags()
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the local cluster (default: in-cluster service account)")
	node := fs.String("node-name", "", "this node's name (default: $NODE_NAME)")
	namespace := fs.String("namespace", "", "the agent's namespace, holding the fabric plan (default: $POD_NAMESPACE)")
	metricsAddr := fs.String("metrics-addr", fmt.Sprintf(":%d", fabricapi.MetricsPort), "address serving /healthz and /readyz, and /metrics and /trace to the loopback and to bearer tokens that may get them (empty: off; no host: the loopback and $POD_IP)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		log, err := newLogger(cmd.ErrOrStderr(), *logFormat, *logLevel)
		if err != nil {
			return usageError{err: err}
		}
		if *node == "" {
			*node = os.Getenv("NODE_NAME")
		}
		if *namespace == "" {
			*namespace = os.Getenv("POD_NAMESPACE")
		}
		if *node == "" || *namespace == "" {
			return usageErrorf("--node-name and --namespace are required (or NODE_NAME and POD_NAMESPACE)")
		}
		return runFabric(cmd.Context(), log, *kubeconfig, *node, *namespace, *metricsAddr)
	}
	return cmd
}

// runFabric applies this node's part of the fabric plan until ctx ends,
// serving its health and metrics on metricsAddr.
func runFabric(ctx context.Context, log *slog.Logger, kubeconfig, node, namespace, metricsAddr string) error {
	agent.RouteKubernetesLogs(log)
	restCfg, err := agent.KubeConfig(kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubeclient.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("Kubernetes client: %w", err)
	}
	reg := agent.NewRegistry()
	// Ready once this node holds the newest plan it could read.
	var applied atomic.Pointer[error]
	notYet := errors.New("no plan applied yet")
	applied.Store(&notYet)
	if metricsAddr != "" {
		var podIP netip.Addr
		if v := os.Getenv("POD_IP"); v != "" {
			if podIP, err = netip.ParseAddr(v); err != nil {
				return fmt.Errorf("$POD_IP %q: %w", v, err)
			}
		}
		addrs, err := apiauth.Addresses(metricsAddr, podIP)
		if err != nil {
			return err
		}
		guard, err := apiauth.New(apiauth.Config{Client: client, Log: log.With("component", "metrics server")})
		if err != nil {
			return err
		}
		guarded := http.NewServeMux()
		// Uncompressed, as the agent's: a gzip writer is about 1 MiB.
		guarded.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{DisableCompression: true}))
		mux := http.NewServeMux()
		mux.Handle("/", guard.Wrap(guarded))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			if err := *applied.Load(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, "ok\n")
		})
		// The node's routing state, for flotilla trace.
		guarded.Handle(live.Path, live.Handler(func(context.Context) (trace.NodeReport, error) {
			k, err := live.ReadKernel(live.Config{})
			if err != nil {
				return trace.NodeReport{Node: node, Errors: []string{err.Error()}}, nil
			}
			return trace.NodeReport{Node: node, Kernel: k}, nil
		}, log))
		srv := apiauth.NewServer(mux)
		for _, addr := range addrs {
			l, err := net.Listen("tcp", addr)
			if err != nil {
				srv.Close()
				return fmt.Errorf("metrics address %s: %w", addr, err)
			}
			go srv.Serve(l)
		}
		defer srv.Close()
	}
	return fabricapi.RunNode(ctx, fabricapi.NodeConfig{
		Client: client, Namespace: namespace, NodeName: node,
		Fabric:  fabric.Config{Logger: log, Metrics: reg},
		Log:     log.With("node", node),
		Applied: func(err error) { applied.Store(&err) },
	})
}
