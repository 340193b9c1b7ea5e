package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

func init() { register(newPeerCommand) }

func newPeerCommand() *cobra.Command {
	return withVerbs(&cobra.Command{
		Use:     "peer",
		GroupID: groupFederation,
		Short:   "list the peers, show one, or accept or deny networking with one: peer list|show|accept|deny",
		Long:    "List the peers, show one, or accept or deny networking with one. NAME is a peer's cluster name or ID.",
	},
		peerTableCommand(&cobra.Command{Use: "list", Short: "the peers, as kubectl get does (-o wide|json|yaml|name)"}, peerListColumns),
		newPeerShowCommand(),
		newNetworkingCommand(v1alpha1.NetworkingAccept, "connect to a peer (spec.networking: Accept) and show progress until Connected"),
		newNetworkingCommand(v1alpha1.NetworkingDeny, "tear the tunnel to a peer down on both sides (spec.networking: Deny)"),
	)
}

// namePeer is what a verb on one peer says when it is not named.
const namePeer = "name the peer (its cluster name or ID, as `flotilla status` shows them)"

// newPeerShowCommand: one peer, as kubectl get peer NAME does.
func newPeerShowCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "show NAME",
		Short: "one peer, as kubectl get peer NAME does: every column of status (-o wide|json|yaml|name)",
		Args:  oneArg(namePeer),
	}
	cluster := clusterFlags(cmd)
	cmd.ValidArgsFunction = completePeers(cluster)
	o := outputFlag(cmd, peerFormats...)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		format, err := parseOutput(*o, peerFormats...)
		if err != nil {
			return err
		}
		c, err := cluster.client()
		if err != nil {
			return err
		}
		peer, err := findPeer(cmd.Context(), c, args[0])
		if err != nil {
			return err
		}
		if format == outputJSON || format == outputYAML || format == outputName {
			return writeObject(cmd.OutOrStdout(), &peer, "Peer", "peer", format)
		}
		return writePeers(cmd.OutOrStdout(), []v1alpha1.Peer{peer}, format, peerStatusColumns, time.Now())
	}
	return cmd
}

// newNetworkingCommand is peer accept or peer deny: it writes the admin's
// decision into the Peer's spec and, with --wait, shows the agent's
// progress until the phase it leads to.
func newNetworkingCommand(to v1alpha1.Networking, short string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   strings.ToLower(string(to)) + " NAME",
		Short: short,
		Args:  oneArg(namePeer),
	}
	cluster := clusterFlags(cmd)
	cmd.ValidArgsFunction = completePeers(cluster)
	wait := waitFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx, stdout := cmd.Context(), cmd.OutOrStdout()
		c, err := cluster.client()
		if err != nil {
			return err
		}
		peer, err := findPeer(ctx, c, args[0])
		if err != nil {
			return err
		}
		gen, err := patchSpec(ctx, c, peer, map[string]any{"networking": to})
		if err != nil {
			return apiError("patch", peer.Name, err)
		}
		fmt.Fprintf(stdout, "peer %s: networking %s in spec (generation %d)\n", peerName(peer), to, gen)
		if *wait == 0 {
			return nil
		}
		want := v1alpha1.PhaseConnected
		if to == v1alpha1.NetworkingDeny {
			want = v1alpha1.PhaseDenied
		}
		return waitPhase(ctx, c, stdout, peer, gen, want, *wait)
	}
	return cmd
}

// completePeers completes a peer's name: the peers of the cluster the
// flags name, by cluster name, their IDs beside.
func completePeers(cluster *clusterRef) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		c, err := cluster.client()
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		peers, err := listPeers(ctx, c)
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		var names []cobra.Completion
		for _, p := range peers {
			if p.Status.ClusterName == "" {
				names = append(names, p.Name)
			} else {
				names = append(names, cobra.CompletionWithDesc(p.Status.ClusterName, p.Name))
			}
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

func peerName(p v1alpha1.Peer) string {
	if p.Status.ClusterName == "" {
		return p.Name
	}
	return p.Status.ClusterName + " (" + p.Name + ")"
}

// waitPhase watches the Peer until the agent, having acted on generation
// gen, reports phase want; it prints each change of phase and of what
// holds the peering up on the way.
func waitPhase(ctx context.Context, c client.WithWatch, w io.Writer, peer v1alpha1.Peer, gen int64, want v1alpha1.Phase, timeout time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last *v1alpha1.Peer
	shown := ""
	_, err := watchtools.UntilWithSync(wctx, peerWatch(c, peer.Name), &v1alpha1.Peer{}, nil, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Deleted {
			return false, fmt.Errorf("peer %s was deleted while waiting (the cluster left the federation, or someone deleted the Peer; the agent makes it again if the cluster is still a member)", peerName(peer))
		}
		p, ok := ev.Object.(*v1alpha1.Peer)
		if !ok {
			return false, nil
		}
		last = p
		if line := progressLine(p); line != shown {
			shown = line
			fmt.Fprintln(w, line)
		}
		if p.Status.ObservedGeneration < gen {
			return false, nil
		}
		if want == v1alpha1.PhaseConnected && p.Status.Phase == v1alpha1.PhaseDenied {
			return false, fmt.Errorf("peer %s is Denied%s; its admin accepts this cluster there with `%s peer accept`", peerName(peer), blocking(p), progName)
		}
		return p.Status.Phase == want, nil
	})
	switch {
	case err == nil:
		fmt.Fprintf(w, "peer %s: %s\n", peerName(peer), want)
		return nil
	case wctx.Err() == nil:
		return err
	case ctx.Err() != nil:
		return fmt.Errorf("stopped waiting for %s: the change to the Peer's spec stands and the agent goes on acting on it (`%s peer list` shows where it stands)", want, progName)
	case last == nil || last.Status.ObservedGeneration < gen:
		return fmt.Errorf("the agent has not acted on the change within %s (is it running? `kubectl -n flotilla-system logs deploy/flotilla-agent`)", timeout)
	}
	return fmt.Errorf("peer %s is %s after %s, not %s%s; `%s peer list -o wide` shows more, the agent's log why (`kubectl -n flotilla-system logs deploy/flotilla-agent`)",
		peerName(peer), orDash(string(last.Status.Phase)), timeout, want, blocking(last), progName)
}

// progressLine is the phase and the first condition on the way to
// Connected that does not hold, with the agent's reason and message.
func progressLine(p *v1alpha1.Peer) string {
	return "  " + orDash(string(p.Status.Phase)) + blocking(p)
}

// blocking says which condition on the way to Connected does not hold.
func blocking(p *v1alpha1.Peer) string {
	for _, t := range []string{v1alpha1.ConditionMember, v1alpha1.ConditionReachable, v1alpha1.ConditionAccepted, v1alpha1.ConditionViewsAgreed, v1alpha1.ConditionTunnelUp} {
		c := meta.FindStatusCondition(p.Status.Conditions, t)
		if c != nil && c.Status != metav1.ConditionTrue {
			return fmt.Sprintf(": %s %s: %s", t, c.Reason, c.Message)
		}
	}
	return ""
}

// peerWatch lists and watches the one Peer named name.
func peerWatch(c client.WithWatch, name string) toolscache.ListerWatcher {
	field := "metadata.name=" + name
	return &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = field
			var l v1alpha1.PeerList
			err := c.List(ctx, &l, &client.ListOptions{Raw: &opts})
			return &l, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = field
			return c.Watch(ctx, &v1alpha1.PeerList{}, &client.ListOptions{Raw: &opts})
		},
	}
}

// apiError says what to do about an API error on Peers: whom to ask for
// which permission, or that Flotilla is not installed.
func apiError(verb, name string, err error) error {
	what := "peers.flotilla.io"
	if name != "" {
		what += " " + name
	}
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("you may not %s peers.flotilla.io (cluster-scoped): %w; ask an admin for a ClusterRole allowing %q on peers.flotilla.io, bound to you "+
			"(`kubectl create clusterrole flotilla-peers --verb=get,list,watch,patch --resource=peers.flotilla.io`, then `kubectl create clusterrolebinding flotilla-peers --clusterrole=flotilla-peers --user=YOU`)",
			verb, err, verb)
	case meta.IsNoMatchError(err):
		return fmt.Errorf("this cluster has no Peers resource: is Flotilla installed (docs/install.md)? %w", err)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("the API server did not accept your credentials: %w (check the kubeconfig's user)", err)
	case utilnet.IsConnectionRefused(err) || utilnet.IsTimeout(err):
		return fmt.Errorf("cannot reach the API server: %w (is the kubeconfig's cluster the one meant, and up? `kubectl cluster-info` says where it points)", err)
	}
	return fmt.Errorf("%s %s: %w", verb, what, err)
}

// noSuchPeer names the peers there are, so that the user picks one.
func noSuchPeer(name string, peers []v1alpha1.Peer) error {
	if len(peers) == 0 {
		return fmt.Errorf("no peer named %q: this cluster has no peers yet (no other cluster of the federation has been discovered)", name)
	}
	names := make([]string, len(peers))
	for i, p := range peers {
		names[i] = peerName(p)
	}
	sort.Strings(names)
	return fmt.Errorf("no peer named %q; the peers are: %s", name, strings.Join(names, ", "))
}
