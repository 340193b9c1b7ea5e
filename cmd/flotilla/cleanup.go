package main

import (
	"github.com/spf13/cobra"
)

func init() { register(newCleanupCommand) }

// newCleanupCommand removes the tunnel's link, routes and nftables table,
// and the fabric's routes, rules and nftables table (on any node). It
// takes the same names the agent was started with and touches only
// objects tagged as ours under those names: routes only through the
// named link, and only if that link is tagged ours. With --node it runs
// as a Job on that node, which needs no netlink here: the form macOS's
// CLI has.
func newCleanupCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "cleanup",
		GroupID: groupNode,
		Short:   "remove every network object the agent owns on this host",
		Args:    noArgs,
	}
	host := addHostCleanupFlags(cmd.Flags())
	job := cleanupJob{cluster: clusterFlags(cmd)}
	fs := cmd.Flags()
	fs.StringVar(&job.node, "node", "", "run the cleanup on this node of the cluster, as a Job with your rights (hostNetwork, NET_ADMIN), instead of on this host")
	fs.StringVar(&job.namespace, "namespace", "kube-system", "with --node: the namespace of the Job (its Pod Security level must admit host network and NET_ADMIN)")
	fs.StringVar(&job.image, "image", releaseImage(), "with --node: the image of the Job, the agent's")
	fs.DurationVar(&job.wait, "wait", defaultWait, "with --node: how long to wait for the Job")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if job.node != "" {
			if err := host.checkForJob(); err != nil {
				return err
			}
			return job.run(cmd.Context(), cmd.OutOrStdout(), cleanupFlags(cmd))
		}
		return host.run(cmd.OutOrStdout())
	}
	return cmd
}

// cleanupFlags are the flags the Job's cleanup takes over: those of the
// names the agent ran with that were given.
func cleanupFlags(cmd *cobra.Command) []string {
	var args []string
	for _, name := range hostCleanupFlagNames {
		if f := cmd.Flags().Lookup(name); f.Changed {
			args = append(args, "--"+name+"="+f.Value.String())
		}
	}
	return args
}

// hostCleanupFlagNames are the names the agent ran with, which the
// cleanup on a node takes.
var hostCleanupFlagNames = []string{"wireguard-interface", "route-table", "route-protocol", "nft-table", "fabric-table", "fabric-nft-table"}
