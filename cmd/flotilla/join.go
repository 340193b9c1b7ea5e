package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/flotilla-io/flotilla/discovery"
)

func init() {
	register(command{
		name:    "join",
		summary: "join this cluster to the federation of another: --context A --remote-context B, with your own rights on both",
		run:     runJoin,
	})
}

func runJoin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("join", stderr)
	var o joinOptions
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster that joins (default: $KUBECONFIG or ~/.kube/config)")
	fs.StringVar(&o.Context, "context", "", "kubeconfig context of the cluster that joins (default: the current context)")
	fs.StringVar(&o.RemoteKubeconfig, "remote-kubeconfig", "", "kubeconfig of a cluster of the federation to join (default: --kubeconfig's)")
	fs.StringVar(&o.RemoteContext, "remote-context", "", "kubeconfig context of a cluster of the federation to join")
	fs.StringVar(&o.Namespace, "namespace", agentNamespace, "the agents' namespace on both clusters")
	fs.DurationVar(&o.Wait, "wait", 3*time.Minute, "how long to wait for Connected both ways before undoing the change")
	fs.BoolVar(&o.Force, "force", false, "join even when this cluster belongs to another federation (it leaves that one)")
	fs.BoolVar(&o.Accept, "accept", false, "where an agent runs with --peering=manual, accept the other cluster on its Peer (spec.networking: Accept) instead of stopping to say so")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.RemoteKubeconfig == "" && o.RemoteContext == "" {
		fmt.Fprintf(stderr, "%s join: say which cluster to join: --remote-context or --remote-kubeconfig\n", progName)
		return errUsage
	}
	if o.RemoteKubeconfig == "" {
		o.RemoteKubeconfig = o.Kubeconfig
	}
	o.Out = stdout
	return join(ctx, o)
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
