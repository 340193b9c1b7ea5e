package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// acceptGrace is how long a join that found one side waiting for its
// admin goes on watching, so that it names both sides when both wait.
const acceptGrace = 2 * time.Second

// peerSide is one side of the peering a join waits for: the Peer that
// cluster has of the other one.
type peerSide struct {
	side  *joinSide
	other published
	// hint is how the user names this cluster to the CLI.
	hint  string
	peer  *v1alpha1.Peer
	shown string
	// accepted: the join set spec.networking: Accept on the Peer.
	accepted bool
}

// waitConnected waits until A and B each have a Peer of the other and
// both are Connected, printing each change on the way. Where an agent
// runs with --peering=manual it accepts the other cluster (--accept) or
// returns errAwaitingAcceptance, saying what to accept.
func waitConnected(ctx context.Context, o joinOptions, a, b *joinSide, ownA, ownB published) error {
	sides := []*peerSide{
		{side: a, other: ownB, hint: clusterHint(o.Kubeconfig, o.Context)},
		{side: b, other: ownA, hint: clusterHint(o.RemoteKubeconfig, o.RemoteContext)},
	}
	seen := false
	var waitingSince time.Time
	var failure error
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		for _, s := range sides {
			if err := s.read(ctx); err != nil {
				return false, err
			}
		}
		if sides[0].peer == nil || sides[1].peer == nil {
			return false, nil
		}
		if !seen {
			seen = true
			fmt.Fprintf(o.Out, "peers see each other: %s has Peer %s, %s has Peer %s\n",
				a.name, peerName(*sides[0].peer), b.name, peerName(*sides[1].peer))
		}
		connected := true
		var waiting []*peerSide
		for _, s := range sides {
			if line := fmt.Sprintf("  %s: Peer %s: %s", s.side.name, peerName(*s.peer), strings.TrimSpace(progressLine(s.peer))); line != s.shown {
				s.shown = line
				fmt.Fprintln(o.Out, line)
			}
			connected = connected && s.peer.Status.Phase == v1alpha1.PhaseConnected
			if s.peer.Status.Phase == v1alpha1.PhaseDenied {
				failure = fmt.Errorf("%s denies networking with %s (Peer %s%s): its admin accepts it with `%s peer accept %s%s`",
					s.side.name, s.other.name(), peerName(*s.peer), blocking(s.peer), progName, s.peer.Name, s.hint)
				return false, failure
			}
			if c := meta.FindStatusCondition(s.peer.Status.Conditions, v1alpha1.ConditionAccepted); c != nil && c.Reason == "WaitingForAdmin" {
				waiting = append(waiting, s)
			}
		}
		if connected {
			return true, nil
		}
		if len(waiting) == 0 {
			waitingSince = time.Time{}
			return false, nil
		}
		if o.Accept {
			for _, s := range waiting {
				if err := s.accept(ctx, o); err != nil {
					return false, err
				}
			}
			return false, nil
		}
		if waitingSince.IsZero() {
			waitingSince = time.Now()
		}
		if time.Since(waitingSince) < acceptGrace && len(waiting) < len(sides) {
			return false, nil
		}
		var todo []string
		for _, s := range waiting {
			todo = append(todo, fmt.Sprintf("on %s, `%s peer accept %s%s`", s.side.name, progName, s.peer.Name, s.hint))
		}
		failure = fmt.Errorf("%w: %s and %s see each other, and networking waits for an admin (--peering=manual): %s; or run this join again with --accept",
			errAwaitingAcceptance, a.name, b.name, strings.Join(todo, "; "))
		return false, failure
	})
	switch {
	case err == nil:
		fmt.Fprintf(o.Out, "Connected both ways: %s and %s\n", a.name, b.name)
		return nil
	case failure != nil:
		return failure
	case ctx.Err() == nil:
		return err
	case !seen:
		return fmt.Errorf("%s and %s do not see each other within --wait %s: is %s's agent running, and can %s's gateway reach %s's gossip address %s (UDP and TCP)? (`kubectl -n %s logs deploy/flotilla-agent` on either side)",
			a.name, b.name, o.Wait, b.name, a.name, b.name, strings.Join(ownB.seeds, ", "), a.ns)
	}
	var why []string
	for _, s := range sides {
		if s.peer.Status.Phase != v1alpha1.PhaseConnected {
			why = append(why, fmt.Sprintf("%s's Peer %s is %s%s", s.side.name, peerName(*s.peer), orDash(string(s.peer.Status.Phase)), blocking(s.peer)))
		}
	}
	return fmt.Errorf("not Connected both ways within --wait %s: %s (`%s peer list -o wide` on each side shows more)", o.Wait, strings.Join(why, "; "), progName)
}

// read gets the side's Peer of the other cluster; nil while there is none.
func (s *peerSide) read(ctx context.Context) error {
	var p v1alpha1.Peer
	err := s.side.peers.Get(ctx, client.ObjectKey{Name: s.other.clusterID}, &p)
	switch {
	case apierrors.IsNotFound(err):
		s.peer = nil
		return nil
	case err != nil && (apierrors.IsForbidden(err) || meta.IsNoMatchError(err) || apierrors.IsUnauthorized(err)):
		return fmt.Errorf("%s: %w", s.side.name, apiError("get", s.other.clusterID, err))
	case err != nil:
		return nil // a passing failure; the next poll tells
	}
	s.peer = &p
	return nil
}

// accept sets spec.networking: Accept on the side's Peer, once.
func (s *peerSide) accept(ctx context.Context, o joinOptions) error {
	if s.accepted {
		return nil
	}
	gen, err := patchSpec(ctx, s.side.peers, *s.peer, map[string]any{"networking": v1alpha1.NetworkingAccept})
	if err != nil {
		return fmt.Errorf("%s: %w", s.side.name, apiError("patch", s.peer.Name, err))
	}
	s.accepted = true
	fmt.Fprintf(o.Out, "%s accepts %s: Peer %s spec.networking Accept (generation %d)\n", s.side.name, s.other.name(), s.peer.Name, gen)
	return nil
}

// clusterHint is the flags that name a cluster as the user named it.
func clusterHint(kubeconfig, kubeContext string) string {
	var h string
	if kubeconfig != "" {
		h += " --kubeconfig " + kubeconfig
	}
	if kubeContext != "" {
		h += " --context " + kubeContext
	}
	return h
}
