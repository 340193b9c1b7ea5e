package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aboutv1alpha1 "github.com/flotilla-io/flotilla/api/about/v1alpha1"
	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/podhttp"
	"github.com/flotilla-io/flotilla/observe/graph"
)

func init() { register(newGraphCommand) }

// The agent as deploy/ installs it: where its metrics are read from.
const (
	agentNamespace = "flotilla-system"
	agentSelector  = "app.kubernetes.io/name=flotilla,app.kubernetes.io/component=agent"
	// metricsPort names the agent's metrics port; the API server's pod
	// proxy wants its number.
	metricsPort = "metrics"
)

func newGraphCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "graph",
		GroupID: groupDiagnose,
		Short:   "draw the federation: clusters, tunnels, views both ways, grants (dot, svg or json)",
		Args:    noArgs,
	}
	format := cmd.Flags().StringP("format", "o", "dot", "output format: dot (Graphviz), svg (drawn here, no Graphviz needed) or json")
	_ = cmd.RegisterFlagCompletionFunc("format", cobra.FixedCompletions([]string{"dot", "svg", "json"}, cobra.ShellCompDirectiveNoFileComp))
	clusters := clusterListFlags(cmd, "to merge several clusters' own reports")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		write, ok := map[string]func(io.Writer, graph.Graph) error{
			"dot": graph.WriteDOT, "svg": graph.WriteSVG, "json": graph.WriteJSON,
		}[*format]
		if !ok {
			return usageErrorf("--format %q: want dot, svg or json", *format)
		}
		refs, err := clusters.refs()
		if err != nil {
			return err
		}
		var reports []graph.Report
		for _, r := range refs {
			report, err := clusterReport(cmd.Context(), r, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			reports = append(reports, report)
		}
		return write(cmd.OutOrStdout(), graph.Build(reports, time.Now()))
	}
	return cmd
}

// clusterReport reads what one cluster says of itself and its peers. Only
// its Peers are needed; what else cannot be read (its cluster ID, nodes,
// offloaded namespaces, the agent's traffic counters) is left out with a
// note on stderr.
func clusterReport(ctx context.Context, ref clusterRef, stderr io.Writer) (graph.Report, error) {
	cfg, context, err := ref.restConfig()
	if err != nil {
		return graph.Report{}, err
	}
	where := cfg.Host
	note := func(what string, err error) {
		fmt.Fprintf(stderr, "flotilla graph: %s: %s not shown: %v\n", where, what, err)
	}

	c, err := graphClient(cfg)
	if err != nil {
		return graph.Report{}, err
	}
	var peers v1alpha1.PeerList
	if err := c.List(ctx, &peers); err != nil {
		if meta.IsNoMatchError(err) {
			return graph.Report{}, fmt.Errorf("%s: no Peers there: Flotilla is not installed (docs/install.md)", where)
		}
		return graph.Report{}, fmt.Errorf("%s: list Peers: %w", where, err)
	}
	r := graph.Report{Self: graph.Self{Nodes: -1}, Peers: graph.PeersOf(peers.Items)}
	// The agent writes its cluster ID as KEP-2149's property; its name
	// lives only in its flags, so the other clusters' Peers supply it,
	// else the kubeconfig's context stands in.
	var id aboutv1alpha1.ClusterProperty
	switch err := c.Get(ctx, client.ObjectKey{Name: "cluster.clusterset.k8s.io"}, &id); {
	case err == nil:
		r.Self.ID = id.Spec.Value
	case !absent(err):
		note("cluster ID", err)
	}
	r.Self.Alias = context
	var offloads v1alpha1.NamespaceOffloadList
	switch err := c.List(ctx, &offloads); {
	case err == nil:
		r.Offloads = graph.OffloadsOf(offloads.Items)
	case !absent(err):
		note("offloaded namespaces", err)
	}
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return graph.Report{}, fmt.Errorf("%s: client: %w", where, err)
	}
	// Virtual nodes stand for providers; they are not this cluster's.
	nodes, err := core.Nodes().List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelVirtualNode + "!=true"})
	if err != nil {
		note("node count", err)
	} else {
		r.Self.Nodes = len(nodes.Items)
	}
	if len(r.Peers) > 0 {
		traffic, err := agentTraffic(ctx, cfg, core)
		if err != nil {
			note("traffic", err)
		}
		r.WithTraffic(traffic)
	}
	return r, nil
}

// graphClient reads the flotilla.io and about.k8s.io objects.
func graphClient(cfg *rest.Config) (client.Client, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{v1alpha1.AddToScheme, aboutv1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, fmt.Errorf("%s: client: %w", cfg.Host, err)
	}
	return c, nil
}

// absent: the kind is not installed or the object does not exist, which
// a graph shows as nothing.
func absent(err error) bool {
	return apierrors.IsNotFound(err) || meta.IsNoMatchError(err)
}

// agentTraffic reads the tunnel counters from the agent's /metrics,
// through a port-forward to its pod (authorized by the API server with
// the caller's rights; the agent serves its loopback without a token).
func agentTraffic(ctx context.Context, cfg *rest.Config, core corev1client.CoreV1Interface) (map[string]graph.Counters, error) {
	pods, err := core.Pods(agentNamespace).List(ctx, metav1.ListOptions{LabelSelector: agentSelector})
	if err != nil {
		return nil, fmt.Errorf("find the agent: %w", err)
	}
	for _, p := range pods.Items {
		if p.Status.Phase != "Running" {
			continue
		}
		port := 9470
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == metricsPort {
					port = int(cp.ContainerPort)
				}
			}
		}
		page, err := podhttp.Get(ctx, cfg, agentNamespace, p.Name, port, "/metrics")
		if err != nil {
			return nil, fmt.Errorf("read the metrics of agent pod %s/%s: %w", agentNamespace, p.Name, err)
		}
		return graph.ParseTraffic(bytes.NewReader(page))
	}
	return nil, fmt.Errorf("no running agent pod in %s (%s)", agentNamespace, agentSelector)
}
