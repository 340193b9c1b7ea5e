package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

func init() {
	register(newGrantCommand)
	register(newRevokeCommand)
}

func newGrantCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "grant PEER",
		GroupID: groupOffload,
		Short:   "let a peer offload to this cluster, with limits (Peer spec.offloading: Grant)",
		Args:    oneArg(namePeer),
	}
	cluster := clusterFlags(cmd)
	cmd.ValidArgsFunction = completePeers(cluster)
	wait := waitFlag(cmd)
	cpu := cmd.Flags().String("cpu", "", "CPU the peer's pods may request in all (a quantity: 4, 500m); empty: no limit")
	memory := cmd.Flags().String("memory", "", "memory the peer's pods may request in all (8Gi); empty: no limit")
	pods := cmd.Flags().Int64("pods", 0, "how many pods the peer may run here at once; 0: no limit")
	namespaces := cmd.Flags().Int64("namespaces", 0, "how many namespaces the peer may have mirrored here; 0: no limit")
	o := outputFlag(cmd, peerFormats...)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx, stdout := cmd.Context(), cmd.OutOrStdout()
		out, progress, err := resultOutput(*o, stdout, cmd.ErrOrStderr())
		if err != nil {
			return err
		}
		limits, err := grantLimits(*cpu, *memory, *pods, *namespaces)
		if err != nil {
			return err
		}
		c, err := cluster.client()
		if err != nil {
			return err
		}
		peer, err := findPeer(ctx, c, args[0])
		if err != nil {
			return err
		}
		spec := map[string]any{"offloading": v1alpha1.OffloadingGrant, "offloadLimits": limits}
		gen, err := patchSpec(ctx, c, peer, spec)
		if err != nil {
			return err
		}
		fmt.Fprintf(progress, "peer %s (%s): offloading granted in spec (generation %d)\n", orDash(peer.Status.ClusterName), peer.Name, gen)
		if err := waitGrant(ctx, c, progress, peer.Name, gen, *wait, true); err != nil {
			return err
		}
		return writePeerResult(ctx, c, stdout, peer.Name, out)
	}
	return cmd
}

func newRevokeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "revoke PEER",
		GroupID: groupOffload,
		Short:   "stop a peer offloading to this cluster; its credential stops working (spec.offloading: Deny)",
		Args:    oneArg(namePeer),
	}
	cluster := clusterFlags(cmd)
	cmd.ValidArgsFunction = completePeers(cluster)
	wait := waitFlag(cmd)
	o := outputFlag(cmd, peerFormats...)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx, stdout := cmd.Context(), cmd.OutOrStdout()
		out, progress, err := resultOutput(*o, stdout, cmd.ErrOrStderr())
		if err != nil {
			return err
		}
		c, err := cluster.client()
		if err != nil {
			return err
		}
		peer, err := findPeer(ctx, c, args[0])
		if err != nil {
			return err
		}
		gen, err := patchSpec(ctx, c, peer, map[string]any{"offloading": v1alpha1.OffloadingDeny})
		if err != nil {
			return err
		}
		fmt.Fprintf(progress, "peer %s (%s): offloading denied in spec (generation %d)\n", orDash(peer.Status.ClusterName), peer.Name, gen)
		if err := waitGrant(ctx, c, progress, peer.Name, gen, *wait, false); err != nil {
			return err
		}
		return writePeerResult(ctx, c, stdout, peer.Name, out)
	}
	return cmd
}

// resultOutput reads a verb's -o: with a format, progress goes to stderr
// and stdout holds only the object once done, for a script to read.
func resultOutput(o string, stdout, stderr io.Writer) (output, io.Writer, error) {
	out, err := parseOutput(o, peerFormats...)
	if err != nil {
		return "", nil, err
	}
	if out == outputTable {
		return out, stdout, nil
	}
	return out, stderr, nil
}

// writePeerResult prints the Peer as it is now in format o (nothing for
// the default, whose progress lines said it all).
func writePeerResult(ctx context.Context, c client.Client, w io.Writer, name string, o output) error {
	if o == outputTable {
		return nil
	}
	var p v1alpha1.Peer
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
		return apiError("get", name, err)
	}
	if o == outputWide {
		return writePeers(w, []v1alpha1.Peer{p}, outputWide, peerWideColumns, time.Now())
	}
	return writeObject(w, &p, "Peer", "peer", o)
}

// grantLimits checks the flags and returns the spec's offloadLimits; nil
// when no limit is given.
func grantLimits(cpu, memory string, pods, namespaces int64) (*v1alpha1.OffloadLimits, error) {
	var l v1alpha1.OffloadLimits
	for _, q := range []struct {
		flag, v string
		to      **resource.Quantity
	}{{"--cpu", cpu, &l.CPU}, {"--memory", memory, &l.Memory}} {
		if q.v == "" {
			continue
		}
		v, err := resource.ParseQuantity(q.v)
		if err != nil || v.Sign() < 0 {
			return nil, fmt.Errorf("%s %q: want a non-negative quantity such as 4, 500m or 8Gi", q.flag, q.v)
		}
		*q.to = &v
	}
	for _, n := range []struct {
		flag string
		v    int64
		to   **int64
	}{{"--pods", pods, &l.Pods}, {"--namespaces", namespaces, &l.Namespaces}} {
		switch {
		case n.v < 0:
			return nil, fmt.Errorf("%s %d: want 0 (no limit) or more", n.flag, n.v)
		case n.v > 0:
			v := n.v
			*n.to = &v
		}
	}
	if l == (v1alpha1.OffloadLimits{}) {
		return nil, nil
	}
	return &l, nil
}

// findPeer finds a Peer by its name (the cluster ID) or its cluster's
// human name.
func findPeer(ctx context.Context, c client.Client, name string) (v1alpha1.Peer, error) {
	var peers v1alpha1.PeerList
	if err := c.List(ctx, &peers); err != nil {
		return v1alpha1.Peer{}, apiError("list", "", err)
	}
	var found []v1alpha1.Peer
	for _, p := range peers.Items {
		if p.Name == name || p.Status.ClusterName == name {
			found = append(found, p)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return v1alpha1.Peer{}, noSuchPeer(name, peers.Items)
	}
	ids := make([]string, len(found))
	for i, p := range found {
		ids[i] = p.Name
	}
	return v1alpha1.Peer{}, fmt.Errorf("%d peers are named %q (%s): name one by its ID", len(found), name, strings.Join(ids, ", "))
}

// patchSpec merges spec into the Peer's and returns the new generation.
func patchSpec(ctx context.Context, c client.Client, peer v1alpha1.Peer, spec map[string]any) (int64, error) {
	body, err := json.Marshal(map[string]any{"spec": spec})
	if err != nil {
		return 0, err
	}
	if err := c.Patch(ctx, &peer, client.RawPatch("application/merge-patch+json", body)); err != nil {
		return 0, fmt.Errorf("update Peer %s: %w", peer.Name, err)
	}
	return peer.Generation, nil
}

// waitGrant waits until the agent has acted on generation gen and prints
// what it says.
func waitGrant(ctx context.Context, c client.Client, w io.Writer, name string, gen int64, timeout time.Duration, granted bool) error {
	if timeout == 0 {
		return nil
	}
	var last *metav1.Condition
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var p v1alpha1.Peer
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
			return false, nil
		}
		cond := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionOffloadGranted)
		if cond == nil || cond.ObservedGeneration < gen {
			return false, nil
		}
		if cond.Reason == v1alpha1.ReasonFencesNotEnforced && (last == nil || last.Reason != cond.Reason) {
			fmt.Fprintf(w, "waiting: %s\n", cond.Message)
		}
		last = cond
		// Granted ends the wait; so does a failure the agent reports, and
		// any state once revoked. Fences not yet enforced are waited
		// out: policies just applied take a moment, and the agent proves
		// them again within seconds.
		return cond.Status == metav1.ConditionTrue || !granted ||
			(cond.Reason != "WaitingForPeer" && cond.Reason != v1alpha1.ReasonFencesNotEnforced), nil
	})
	if last == nil {
		return fmt.Errorf("the agent has not acted on the change within %s (is it running? `kubectl -n flotilla-system logs deploy/flotilla-agent`)", timeout)
	}
	fmt.Fprintf(w, "%s: %s\n", last.Reason, last.Message)
	if err != nil && granted && last.Status != metav1.ConditionTrue {
		return fmt.Errorf("not granted yet after %s: %s", timeout, last.Reason)
	}
	if granted && last.Status != metav1.ConditionTrue {
		return fmt.Errorf("not granted: %s", last.Reason)
	}
	return nil
}
