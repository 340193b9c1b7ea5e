package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

func init() { register(newStatusCommand) }

func newStatusCommand() *cobra.Command {
	return peerTableCommand(&cobra.Command{
		Use:     "status",
		GroupID: groupFederation,
		Short:   "show this cluster's peers: phase, endpoint, views, handshake, offloading both ways, traffic mode",
	}, peerStatusColumns)
}

// peerTableCommand makes cmd list this cluster's Peers with the columns
// of table, or as -o asks: status and peer list.
func peerTableCommand(cmd *cobra.Command, table []peerColumn) *cobra.Command {
	cluster := clusterFlags(cmd)
	o := outputFlag(cmd, peerFormats...)
	cmd.Args = noArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		format, err := parseOutput(*o, peerFormats...)
		if err != nil {
			return err
		}
		c, err := cluster.client()
		if err != nil {
			return err
		}
		peers, err := listPeers(cmd.Context(), c)
		if err != nil {
			return err
		}
		return writePeers(cmd.OutOrStdout(), peers, format, table, time.Now())
	}
	return cmd
}

// listPeers lists the Peers, saying what to do when that fails.
func listPeers(ctx context.Context, c client.Client) ([]v1alpha1.Peer, error) {
	var peers v1alpha1.PeerList
	if err := c.List(ctx, &peers); err != nil {
		return nil, apiError("list", "", err)
	}
	return peers.Items, nil
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
