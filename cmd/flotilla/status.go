package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/peering/peerapi"
)

func init() {
	register(command{name: "status", summary: "show this cluster's peers: phase, endpoint, views, handshake, offloading both ways, traffic mode", run: runStatus})
}

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runPeerTable(ctx, "status", peerStatusColumns, args, stdout, stderr)
}

// runPeerTable lists this cluster's Peers with the columns of table, or
// as -o asks: status and peer list.
func runPeerTable(ctx context.Context, name string, table []peerColumn, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster (default: $KUBECONFIG or ~/.kube/config)")
	kubeContext := contextFlag(fs)
	o := outputFlag(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	format, err := parseOutput(*o)
	if err != nil {
		return err
	}
	c, err := clusterClientIn(*kubeconfig, *kubeContext)
	if err != nil {
		return err
	}
	peers, err := listPeers(ctx, c)
	if err != nil {
		return err
	}
	return writePeers(stdout, peers, format, table, time.Now())
}

// listPeers lists the Peers, saying what to do when that fails.
func listPeers(ctx context.Context, c client.Client) ([]v1alpha1.Peer, error) {
	var peers v1alpha1.PeerList
	if err := c.List(ctx, &peers); err != nil {
		return nil, apiError("list", "", err)
	}
	return peers.Items, nil
}

// clusterClient reads and writes the flotilla.io objects of the cluster
// a kubeconfig names, as kubectl finds it: the path given, else
// $KUBECONFIG, else ~/.kube/config.
func clusterClient(kubeconfig string) (client.WithWatch, error) {
	return clusterClientIn(kubeconfig, "")
}

// clusterClientIn is clusterClient in the kubeconfig's context named
// kubeContext; empty: its current context.
func clusterClientIn(kubeconfig, kubeContext string) (client.WithWatch, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: kubeContext}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	// RoleBindings too: offload binds reflection's role in the namespace.
	scheme := peerapi.Scheme()
	if err := rbacv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.NewWithWatch(cfg, client.Options{Scheme: scheme})
}

// traffic is the mode in effect for traffic from the peer and, when
// Segregated, what it may reach: "Segregated (3 pods, 12 service
// endpoints)". "-" until the agent has written it.
func traffic(s v1alpha1.PeerStatus) string {
	if s.Traffic != v1alpha1.TrafficSegregated || s.Allowed == nil {
		return orDash(string(s.Traffic))
	}
	return fmt.Sprintf("%s (%d pods, %d service endpoints)", s.Traffic, s.Allowed.Pods, s.Allowed.Services)
}

// reason is the reason of the condition of type kind, as kubectl's
// HOSTING and OFFLOAD columns show it.
func reason(cs []metav1.Condition, kind string) string {
	if c := meta.FindStatusCondition(cs, kind); c != nil {
		return c.Reason
	}
	return "-"
}

func views(vs []v1alpha1.NetworkView) string {
	var parts []string
	for _, v := range vs {
		if v.Range == v.As {
			parts = append(parts, v.Range)
		} else {
			parts = append(parts, v.Range+"->"+v.As)
		}
	}
	return orDash(strings.Join(parts, ","))
}

// age prints how long ago t was, as kubectl does ("42s", "3m", "5h").
func age(t *metav1.Time, now time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	d := now.Sub(t.Time)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	}
	return fmt.Sprintf("%dh ago", int(d.Hours()))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
