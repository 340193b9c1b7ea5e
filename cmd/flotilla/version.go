package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/internal/podhttp"
	"github.com/flotilla-io/flotilla/internal/version"
	"github.com/flotilla-io/flotilla/peering/protocol"
)

func init() { register(newVersionCommand) }

func newVersionCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "version",
		GroupID: groupDiagnose,
		Short:   "print the version, commit and peering protocol range of this binary and of a cluster's agents",
		Long: `Print the version, commit and peering protocol range of this binary.

With --kubeconfig or --context, also each agent pod's, read from its
/build through the API server's port-forward with your rights, and flag
an agent whose protocol range and this binary's do not read each other's
versions (docs/release.md, "Version skew"). The exit status is 1 when an
agent could not be read or is flagged.`,
		Args: noArgs,
	}
	cluster := clusterFlags(cmd)
	namespace := cmd.Flags().String("namespace", agentNamespace, "the agent's namespace")
	o := outputFlag(cmd, objectFormats...)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		format, err := parseOutput(*o, objectFormats...)
		if err != nil {
			return err
		}
		client := protocol.Build()
		if !cmd.Flags().Changed("kubeconfig") && !cmd.Flags().Changed("context") {
			if format != outputTable {
				return writeJSONOrYAML(cmd.OutOrStdout(), client, format)
			}
			printVersion(cmd.OutOrStdout(), "client", client)
			return nil
		}
		cfg, _, err := cluster.restConfig()
		if err != nil {
			return err
		}
		agents, err := readAgentBuilds(cmd.Context(), cfg, *namespace, client.Protocol)
		if err != nil {
			return err
		}
		v := versions{Client: client, Agents: agents}
		if format != outputTable {
			err = writeJSONOrYAML(cmd.OutOrStdout(), v, format)
		} else {
			writeVersions(cmd.OutOrStdout(), v)
		}
		if err == nil && !v.agree() {
			err = errReported
		}
		return err
	}
	return cmd
}

// versions is what `flotilla version` prints with a cluster: this
// binary's build and each agent pod's.
type versions struct {
	Client version.Info `json:"client"`
	Agents []agentBuild `json:"agents"`
}

// agentBuild is one agent pod's build, or why it was not read.
type agentBuild struct {
	Pod   string        `json:"pod"`
	Node  string        `json:"node,omitempty"`
	Build *version.Info `json:"build,omitempty"`
	// Interoperates: the agent and this binary read each other's
	// protocol versions.
	Interoperates bool   `json:"interoperates"`
	Error         string `json:"error,omitempty"`
}

// agree: every agent was read and interoperates with this binary.
func (v versions) agree() bool {
	for _, a := range v.Agents {
		if a.Build == nil || !a.Interoperates {
			return false
		}
	}
	return true
}

// readAgentBuilds reads the build of every agent pod in ns. An agent
// that cannot be read is an entry saying why; a cluster that refuses or
// lacks the agent's Deployment is an error.
func readAgentBuilds(ctx context.Context, cfg *rest.Config, ns string, client version.Protocol) ([]agentBuild, error) {
	kube, err := kubeclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	d, err := kube.AppsV1().Deployments(ns).Get(ctx, agentDeployment, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("Flotilla is not installed in %s: no Deployment %s (docs/install.md)", ns, agentDeployment)
	}
	if err != nil {
		return nil, apiError("get", "", err)
	}
	pods, err := podsOf(ctx, kube, ns, d.Spec.Selector)
	if err != nil {
		return nil, apiError("list", "", err)
	}
	var out []agentBuild
	for _, p := range pods {
		a := agentBuild{Pod: p.Namespace + "/" + p.Name, Node: p.Spec.NodeName}
		b, err := readAgentBuild(ctx, cfg, p)
		if err != nil {
			a.Error = err.Error()
		} else {
			a.Build, a.Interoperates = &b, client.Interoperates(b.Protocol)
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no agent pod in %s: `kubectl -n %s describe deployment %s` says why", ns, ns, agentDeployment)
	}
	return out, nil
}

// readAgentBuild reads one agent pod's /build on its metrics port.
func readAgentBuild(ctx context.Context, cfg *rest.Config, p corev1.Pod) (version.Info, error) {
	if p.Status.Phase != corev1.PodRunning {
		return version.Info{}, fmt.Errorf("not running (%s)", p.Status.Phase)
	}
	body, err := podhttp.Get(ctx, cfg, p.Namespace, p.Name, containerPort(p, metricsPort, 9470), "/build")
	if err != nil {
		return version.Info{}, err
	}
	b, err := version.Parse(body)
	if err != nil {
		return version.Info{}, fmt.Errorf("its /build: %w", err)
	}
	return b, nil
}

// writeVersions prints the client's build, then each agent's, flagging
// what disagrees.
func writeVersions(w io.Writer, v versions) {
	printVersion(w, "client", v.Client)
	for _, a := range v.Agents {
		whose := "agent " + a.Pod
		if a.Node != "" {
			whose += " on " + a.Node
		}
		if a.Build == nil {
			fmt.Fprintf(w, "%s:\n  not read: %s\n", whose, a.Error)
			continue
		}
		printVersion(w, whose, *a.Build)
		if !a.Interoperates {
			c := v.Client.Protocol
			fmt.Fprintf(w, "  SKEW:     this client writes %d and reads %d to %d: the agent and this client do not read each other; use the client of the agent's release (docs/release.md, \"Version skew\")\n", c.Current, c.Min, c.Max)
		}
	}
}

// printVersion writes one build as the lines `flotilla version` prints,
// under a heading that says whose it is (the client, or an agent).
func printVersion(w io.Writer, whose string, b version.Info) {
	fmt.Fprintf(w, "%s:\n", whose)
	fmt.Fprintf(w, "  version:  %s\n", b.Version)
	fmt.Fprintf(w, "  commit:   %s\n", b.Commit)
	if b.Date != "" {
		fmt.Fprintf(w, "  date:     %s\n", b.Date)
	}
	fmt.Fprintf(w, "  go:       %s %s\n", b.GoVersion, b.Platform)
	fmt.Fprintf(w, "  protocol: %d (reads %d to %d)\n", b.Protocol.Current, b.Protocol.Min, b.Protocol.Max)
}
