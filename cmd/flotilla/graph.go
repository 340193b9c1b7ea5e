package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aboutv1alpha1 "github.com/flotilla-io/flotilla/api/about/v1alpha1"
	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/podhttp"
	"github.com/flotilla-io/flotilla/observe/graph"
)

func init() {
	register(command{name: "graph", summary: "draw the federation: clusters, tunnels, views both ways, grants (dot, svg or json)", run: runGraph})
}

// The agent as deploy/ installs it: where its metrics are read from.
const (
	agentNamespace = "flotilla-system"
	agentSelector  = "app.kubernetes.io/name=flotilla,app.kubernetes.io/component=agent"
	// metricsPort names the agent's metrics port; the API server's pod
	// proxy wants its number.
	metricsPort = "metrics"
)

func runGraph(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("graph", stderr)
	format := fs.String("format", "dot", "output format: dot (Graphviz), svg (drawn here, no Graphviz needed) or json")
	fs.StringVar(format, "o", "dot", "short for --format, as kubectl's -o")
	var kubeconfigs stringList
	fs.Var(&kubeconfigs, "kubeconfig", "kubeconfig of a cluster of the federation; repeat it to merge several clusters' own reports (default: $KUBECONFIG or ~/.kube/config)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	write, ok := map[string]func(io.Writer, graph.Graph) error{
		"dot": graph.WriteDOT, "svg": graph.WriteSVG, "json": graph.WriteJSON,
	}[*format]
	if !ok {
		fmt.Fprintf(stderr, "flotilla graph: --format %q: want dot, svg or json\n", *format)
		return errUsage
	}
	if len(kubeconfigs) == 0 {
		kubeconfigs = stringList{""}
	}
	var reports []graph.Report
	for _, k := range kubeconfigs {
		r, err := clusterReport(ctx, k, stderr)
		if err != nil {
			return err
		}
		reports = append(reports, r)
	}
	return write(stdout, graph.Build(reports, time.Now()))
}

// clusterReport reads what one cluster says of itself and its peers. Only
// its Peers are needed; what else cannot be read (its cluster ID, nodes,
// offloaded namespaces, the agent's traffic counters) is left out with a
// note on stderr.
func clusterReport(ctx context.Context, kubeconfig string, stderr io.Writer) (graph.Report, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil)
	cfg, err := loader.ClientConfig()
	if err != nil {
		return graph.Report{}, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	raw, _ := loader.RawConfig()
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
	r.Self.Alias = raw.CurrentContext
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
