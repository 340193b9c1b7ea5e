//go:build linux

package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/flotilla-io/flotilla/fabric"
	"github.com/flotilla-io/flotilla/tunnel"
)

func init() { register(newCleanupCommand) }

// newCleanupCommand removes the tunnel's link, routes and nftables table, and the
// fabric's routes, rules and nftables table (on any node). It
// takes the same names the agent was started with and touches only objects
// tagged as ours under those names: routes only through the named link,
// and only if that link is tagged ours.
func newCleanupCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "cleanup",
		GroupID: groupNode,
		Short:   "remove every network object the agent owns on this host",
		Args:    noArgs,
	}
	fs := cmd.Flags()
	ifname := fs.String("wireguard-interface", tunnel.DefaultInterface, "name of the WireGuard interface")
	table := fs.Int("route-table", tunnel.DefaultRouteTable, "routing table our routes are in")
	proto := fs.Int("route-protocol", tunnel.DefaultRouteProtocol, "route protocol number that tags our routes (never one of the kernel's or a routing daemon's)")
	nftTable := fs.String("nft-table", tunnel.DefaultNFTable, "name of our nftables table (family ip)")
	fabricTable := fs.Int("fabric-table", fabric.DefaultTable, "routing table of the fabric's routes (docs/fabric.md)")
	fabricNFT := fs.String("fabric-nft-table", fabric.DefaultNFTable, "name of the fabric's nftables table (family ip)")
	job := cleanupJob{cluster: clusterFlags(cmd)}
	fs.StringVar(&job.node, "node", "", "run the cleanup on this node of the cluster, as a Job with your rights (hostNetwork, NET_ADMIN), instead of on this host")
	fs.StringVar(&job.namespace, "namespace", "kube-system", "with --node: the namespace of the Job (its Pod Security level must admit host network and NET_ADMIN)")
	fs.StringVar(&job.image, "image", releaseImage(), "with --node: the image of the Job, the agent's")
	fs.DurationVar(&job.wait, "wait", defaultWait, "with --node: how long to wait for the Job")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if job.node != "" {
			if err := tunnel.CheckRouteProtocol(*proto); err != nil {
				return fmt.Errorf("--route-protocol: %w; nothing removed", err)
			}
			return job.run(cmd.Context(), cmd.OutOrStdout(), cleanupFlags(cmd))
		}
		return cleanup(cmd.OutOrStdout(), *ifname, *table, *proto, *nftTable, *fabricTable, *fabricNFT)
	}
	return cmd
}

func cleanup(stdout io.Writer, ifname string, table, proto int, nftTable string, fabricTable int, fabricNFT string) error {
	// Checked here, before the Config turns 0 into the default: nothing
	// may be removed on a protocol that is not ours.
	if err := tunnel.CheckRouteProtocol(proto); err != nil {
		return fmt.Errorf("--route-protocol: %w; nothing removed", err)
	}
	err := tunnel.Cleanup(tunnel.Config{
		Interface:     ifname,
		RouteTable:    table,
		RouteProtocol: proto,
		NFTable:       nftTable,
	})
	if err != nil {
		return fmt.Errorf("tunnel: %w", err)
	}
	fmt.Fprintf(stdout, "removed tunnel objects: link %s and its routes with protocol %d in table %d, nftables table ip %s\n",
		ifname, proto, table, nftTable)
	if err := fabric.Remove(fabric.Config{Table: fabricTable, RouteProtocol: proto, NFTable: fabricNFT}); err != nil {
		return fmt.Errorf("fabric: %w", err)
	}
	fmt.Fprintf(stdout, "removed fabric objects: routes with protocol %d in table %d and the rules to it, nftables table ip %s\n",
		proto, fabricTable, fabricNFT)
	return nil
}

// cleanupFlags are the flags the Job's cleanup takes over: those of the
// names the agent ran with that were given.
func cleanupFlags(cmd *cobra.Command) []string {
	var args []string
	for _, name := range []string{"wireguard-interface", "route-table", "route-protocol", "nft-table", "fabric-table", "fabric-nft-table"} {
		if f := cmd.Flags().Lookup(name); f.Changed {
			args = append(args, "--"+name+"="+f.Value.String())
		}
	}
	return args
}
