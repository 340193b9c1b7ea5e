package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/flotilla-io/flotilla/discovery"
)

func init() { register(newJoinCommand) }

func newJoinCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "join",
		GroupID: groupFederation,
		Short:   "join this cluster to the federation of another: --context A --remote-context B, with your own rights on both",
		Args:    noArgs,
	}
	var o joinOptions
	local := clusterFlags(cmd)
	cmd.Flags().StringVar(&o.RemoteKubeconfig, "remote-kubeconfig", "", "kubeconfig of a cluster of the federation to join (default: --kubeconfig's)")
	cmd.Flags().StringVar(&o.RemoteContext, "remote-context", "", "kubeconfig context of a cluster of the federation to join")
	cmd.Flags().StringVar(&o.Namespace, "namespace", agentNamespace, "the agents' namespace on both clusters")
	wait := waitFlag(cmd)
	cmd.Flags().BoolVar(&o.Force, "force", false, "join even when this cluster belongs to another federation (it leaves that one)")
	cmd.Flags().BoolVar(&o.Accept, "accept", false, "where an agent runs with --peering=manual, accept the other cluster on its Peer (spec.networking: Accept) instead of stopping to say so")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if o.RemoteKubeconfig == "" && o.RemoteContext == "" {
			return usageErrorf("say which cluster to join: --remote-context or --remote-kubeconfig")
		}
		if *wait <= 0 {
			return usageErrorf("--wait %s: a join waits for Connected both ways and is undone when the wait runs out; give it more than 0", *wait)
		}
		o.Kubeconfig, o.Context, o.Wait = local.kubeconfig, local.context, *wait
		if o.RemoteKubeconfig == "" {
			o.RemoteKubeconfig = o.Kubeconfig
		}
		o.Out = cmd.OutOrStdout()
		return join(cmd.Context(), o)
	}
	return cmd
}

// joinOptions are what `flotilla join` is told. A is the cluster that
// joins; B is a cluster of the federation it joins.
type joinOptions struct {
	Kubeconfig, Context             string
	RemoteKubeconfig, RemoteContext string
	// Namespace is the agents' namespace on both clusters.
	Namespace string
	// Wait bounds the whole join; when it passes, what was changed on A
	// is undone.
	Wait time.Duration
	// Force joins even when A belongs to another federation.
	Force bool
	// Accept accepts the other cluster where an agent runs with
	// --peering=manual.
	Accept bool
	// Out receives one line per step.
	Out io.Writer
}

// errAwaitingAcceptance ends a join whose clusters see each other but
// where an admin must still accept the other cluster: nothing is undone.
var errAwaitingAcceptance = errors.New("awaiting acceptance")

// join reads B's join token with the user's rights on B, gives it to A's
// agent, restarts that agent and waits until both Peers are Connected.
// When anything fails after A was changed, or the wait runs out, the
// change is undone and A is as it was.
func join(ctx context.Context, o joinOptions) error {
	a, err := openJoinSide(o.Kubeconfig, o.Context, o.Namespace)
	if err != nil {
		return err
	}
	b, err := openJoinSide(o.RemoteKubeconfig, o.RemoteContext, o.Namespace)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, o.Wait)
	defer cancel()

	theirs, err := readJoinToken(wctx, b.core, b.ns, b.name)
	if err != nil {
		return err
	}
	b.named(theirs)
	fmt.Fprintf(o.Out, "token read: %s, key %s, seed %s\n", theirs.name(), discovery.Fingerprint(theirs.key), strings.Join(theirs.seeds, ", "))

	before, err := a.state(wctx)
	if err != nil {
		return err
	}
	a.named(before.own)
	if before.own.clusterID == theirs.clusterID {
		return fmt.Errorf("%s and %s are the same cluster (%s): give --context the cluster that joins and --remote-context one of the federation", a.name, b.name, theirs.clusterID)
	}
	member := bytes.Equal(before.own.key, theirs.key)
	var ch *change
	if member {
		fmt.Fprintf(o.Out, "%s already holds %s's federation key: nothing to configure\n", a.name, b.name)
	} else {
		if why := otherFederation(before, theirs.key); why != "" && !o.Force {
			return fmt.Errorf("%s belongs to another federation (%s); joining %s's takes it out of that one. Nothing was changed; pass --force to join anyway", a.name, why, b.name)
		}
		ch = &change{side: a, before: before}
		if err := ch.apply(wctx, o.Out, theirs); err != nil {
			return ch.undoAfter(ctx, o.Out, err)
		}
	}
	err = waitConnected(wctx, o, a, b, before.own, theirs)
	if err == nil || ch == nil || errors.Is(err, errAwaitingAcceptance) {
		return err
	}
	return ch.undoAfter(ctx, o.Out, err)
}
