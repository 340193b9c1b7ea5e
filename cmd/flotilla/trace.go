package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/spf13/cobra"

	"github.com/flotilla-io/flotilla/observe/trace"
	"github.com/flotilla-io/flotilla/observe/trace/collect"
)

func init() { register(newTraceCommand) }

// errBroken: the trace found a broken step, already printed; the exit
// status says so to scripts.
var errBroken = fmt.Errorf("a step is broken: %w", errReported)

func newTraceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "trace SOURCE DESTINATION",
		GroupID: groupDiagnose,
		Short:   "why can't SOURCE reach DESTINATION: the path between two clusters' pods, step by step",
		Long: `Why can't SOURCE reach DESTINATION: the path between two clusters' pods,
step by step, read from the live system, with the first broken step and
what to do.

SOURCE is a pod of this cluster (name, namespace/name or address);
DESTINATION a pod of a peer: its address as this cluster addresses it
(kubectl get peers -o wide shows the views), its real address there, or,
with --peer-context, its name. Exit status 1 when a step is broken.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) < 2 {
				return usageErrorf("name the SOURCE and the DESTINATION")
			}
			return noArgs(nil, args[2:])
		},
	}
	local := &clusterRef{}
	cmd.Flags().StringVar(&local.kubeconfig, "kubeconfig", "", "kubeconfig of the source's cluster (default: $KUBECONFIG or ~/.kube/config)")
	cmd.Flags().StringVar(&local.context, "context", "", "the source cluster's context (default: the kubeconfig's current context)")
	peer := &clusterRef{}
	cmd.Flags().StringVar(&peer.kubeconfig, "peer-kubeconfig", "", "kubeconfig of the destination's cluster (default: --kubeconfig's)")
	cmd.Flags().StringVar(&peer.context, "peer-context", "", "the destination cluster's context: its side of the path is read too (default: only the source's side)")
	o := outputFlag(cmd, objectFormats...)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		format, err := parseOutput(*o, objectFormats...)
		if err != nil {
			return err
		}
		var remote *clusterRef
		if peer.kubeconfig != "" || peer.context != "" {
			remote = peer
			if remote.kubeconfig == "" {
				remote.kubeconfig = local.kubeconfig
			}
		}
		return runTrace(cmd.Context(), cmd.OutOrStdout(), *local, remote, args[0], args[1], format)
	}
	return cmd
}

// runTrace traces from src, a pod of the local cluster, to dst, a pod of
// the remote cluster; nil: only the local side is read.
func runTrace(ctx context.Context, stdout io.Writer, local clusterRef, remote *clusterRef, src, dst string, format output) error {
	here, err := traceSide(ctx, local, collect.Ends{Names: nameOf(src), Addrs: addrOf(src)})
	if err != nil {
		return err
	}
	var there *trace.Cluster
	if remote != nil {
		there, err = traceSide(ctx, *remote, collect.Ends{Names: nameOf(dst), Addrs: trace.Candidates(here, dst)})
		if err != nil {
			return fmt.Errorf("peer cluster: %w", err)
		}
	}
	trace.Name(here, there)
	res := trace.Run(here, there, src, dst, time.Now())
	if format == outputTable {
		err = trace.WriteText(stdout, res)
	} else {
		err = writeJSONOrYAML(stdout, res, format)
	}
	if err != nil {
		return err
	}
	if res.Broken != "" {
		return errBroken
	}
	return nil
}

// traceSide reads one cluster, named after its context.
func traceSide(ctx context.Context, r clusterRef, ends collect.Ends) (*trace.Cluster, error) {
	cfg, name, err := r.restConfig()
	if err != nil {
		return nil, err
	}
	return collect.Collect(ctx, collect.Source{Name: name, Config: cfg}, ends)
}

func nameOf(s string) []string {
	if _, err := netip.ParseAddr(s); err == nil {
		return nil
	}
	return []string{s}
}

func addrOf(s string) []netip.Addr {
	if a, err := netip.ParseAddr(s); err == nil {
		return []netip.Addr{a}
	}
	return nil
}
