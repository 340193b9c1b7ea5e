package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/flotilla-io/flotilla/agent/agentapi"
	"github.com/flotilla-io/flotilla/discovery"
)

// joinManager is the field manager of what `flotilla join` applies.
const joinManager = "flotilla-join"

// undoTimeout bounds undoing a join that failed.
const undoTimeout = 2 * time.Minute

// change is what a join changes on A: the token in its Secret
// flotilla-federation, and its agent restarted to act on it. It knows
// what A was before, so that it can put it back.
type change struct {
	side   *joinSide
	before joinerState
	// applied: the Secret was written; restarted: the agent's pods were
	// deleted, so the agent may hold the key it was given.
	applied, restarted bool
}

// apply gives A's agent the token and waits until it holds its key.
func (c *change) apply(ctx context.Context, out io.Writer, theirs published) error {
	s := c.side
	data := map[string][]byte{agentapi.SecretToken: []byte(theirs.token)}
	if c.before.secret != nil && len(c.before.secret.Data[agentapi.SecretKeyring]) > 0 {
		// A keyring wins over the token at the agent's start: it must
		// name the new key too.
		ring, err := discovery.EncodeKeyring([][]byte{theirs.key})
		if err != nil {
			return err
		}
		data[agentapi.SecretKeyring] = ring
	}
	if err := s.applySecret(ctx, data, c.before.secret == nil); err != nil {
		return err
	}
	c.applied = true
	fmt.Fprintf(out, "%s configured: Secret %s/%s holds the join token of %s\n", s.name, s.ns, agentapi.FederationSecret, theirs.name())
	deleted, err := s.restartAgent(ctx, out)
	c.restarted = deleted
	if err != nil {
		return err
	}
	return s.waitKey(ctx, out, theirs.key)
}

// undoAfter undoes the change after cause and says so; it undoes even
// when ctx was cancelled (an interrupted join).
func (c *change) undoAfter(ctx context.Context, out io.Writer, cause error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	fmt.Fprintf(out, "undoing what was changed on %s: %v\n", c.side.name, cause)
	if err := c.undo(ctx, out); err != nil {
		return fmt.Errorf("%w; undoing the change on %s failed too: %v (its Secret %s/%s may still hold the other federation's token: delete it, or put back what it held, and restart its agent)",
			cause, c.side.name, err, c.side.ns, agentapi.FederationSecret)
	}
	return fmt.Errorf("%w; %s is as it was", cause, c.side.name)
}

func (c *change) undo(ctx context.Context, out io.Writer) error {
	if !c.applied {
		return nil
	}
	s, own := c.side, c.before.own
	if c.restarted {
		// The restarted agent took the key it was given and keeps it in
		// its ledger: hand it its own key back through the keyring it
		// follows, then put the Secret back as it was.
		ring, err := discovery.EncodeKeyring([][]byte{own.key})
		if err != nil {
			return err
		}
		if err := s.applySecret(ctx, map[string][]byte{agentapi.SecretKeyring: ring, agentapi.SecretToken: []byte(own.token)}, c.before.secret == nil); err != nil {
			return err
		}
		if err := s.waitKey(ctx, out, own.key); err != nil {
			return err
		}
	}
	if err := s.restoreSecret(ctx, c.before.secret); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s: Secret %s/%s as it was\n", s.name, s.ns, agentapi.FederationSecret)
	if !c.restarted {
		return nil
	}
	// Restarted once more, the agent holds no seed of the other
	// federation either.
	if _, err := s.restartAgent(ctx, out); err != nil {
		return err
	}
	return s.waitKey(ctx, out, own.key)
}

// applySecret applies data into the Secret flotilla-federation, labelled
// as Flotilla's when the join makes it.
func (s *joinSide) applySecret(ctx context.Context, data map[string][]byte, create bool) error {
	ac := corev1ac.Secret(agentapi.FederationSecret, s.ns).WithData(data)
	if create {
		ac.WithLabels(map[string]string{"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/managed-by": "flotilla"})
	}
	if _, err := s.core.Secrets(s.ns).Apply(ctx, ac, metav1.ApplyOptions{FieldManager: joinManager, Force: true}); err != nil {
		return s.apiError("write Secret "+agentapi.FederationSecret, err)
	}
	return nil
}

// restoreSecret puts the Secret flotilla-federation back as it was:
// deleted when there was none, else its data, labels, annotations and
// field managers as read before.
func (s *joinSide) restoreSecret(ctx context.Context, was *corev1.Secret) error {
	secrets := s.core.Secrets(s.ns)
	cur, err := secrets.Get(ctx, agentapi.FederationSecret, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && was == nil:
		return nil
	case err != nil:
		return s.apiError("read Secret "+agentapi.FederationSecret, err)
	case was == nil:
		uid := cur.UID
		if err := secrets.Delete(ctx, agentapi.FederationSecret, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
			return s.apiError("delete Secret "+agentapi.FederationSecret, err)
		}
		return nil
	}
	cur.Data, cur.Labels, cur.Annotations = was.Data, was.Labels, was.Annotations
	cur, err = secrets.Update(ctx, cur, metav1.UpdateOptions{FieldManager: joinManager})
	if err != nil {
		return s.apiError("restore Secret "+agentapi.FederationSecret, err)
	}
	// The update made this manager own what it put back; an update that
	// changes nothing but the managers sets them as they were.
	cur.ManagedFields = was.ManagedFields
	if _, err := secrets.Update(ctx, cur, metav1.UpdateOptions{FieldManager: joinManager}); err != nil {
		return s.apiError("restore Secret "+agentapi.FederationSecret, err)
	}
	return nil
}

// restartAgent deletes the agent's pods, which its Deployment makes
// again, and waits until every new one is Ready; deleted says whether
// any was. The Deployment is not changed.
func (s *joinSide) restartAgent(ctx context.Context, out io.Writer) (deleted bool, err error) {
	pods := s.core.Pods(s.ns)
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: agentSelector})
	if err != nil {
		return false, s.apiError("list the agent's pods", err)
	}
	if len(list.Items) == 0 {
		return false, fmt.Errorf("%s: no agent pod in %s (selector %s): is the agent installed and scheduled? (`kubectl -n %s get deploy,pods`)", s.name, s.ns, agentSelector, s.ns)
	}
	var old, names []string
	for _, p := range list.Items {
		uid := p.UID
		if err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
			return len(old) > 0, s.apiError("restart the agent: delete pod "+p.Name, err)
		}
		old, names = append(old, string(p.UID)), append(names, p.Name)
	}
	fmt.Fprintf(out, "%s's agent restarting: pod %s deleted\n", s.name, strings.Join(names, ", "))
	var last string
	err = wait.PollUntilContextCancel(ctx, 500*time.Millisecond, false, func(ctx context.Context) (bool, error) {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: agentSelector})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		var ready []string
		for _, p := range list.Items {
			if slices.Contains(old, string(p.UID)) {
				last = "pod " + p.Name + " still terminating"
				return false, nil
			}
			if err := whyNotReady(p); err != nil {
				last = err.Error()
				return false, nil
			}
			ready = append(ready, p.Name)
		}
		if len(ready) == 0 {
			last = "no new pod yet"
			return false, nil
		}
		names = ready
		return true, nil
	})
	if err != nil {
		return true, fmt.Errorf("%s's agent did not come back Ready: %s: %w (`kubectl -n %s describe pods -l %s`)", s.name, last, err, s.ns, agentSelector)
	}
	fmt.Fprintf(out, "%s's agent restarted: pod %s Ready\n", s.name, strings.Join(names, ", "))
	return true, nil
}

// waitKey waits until the agent says it holds key alone.
func (s *joinSide) waitKey(ctx context.Context, out io.Writer, key []byte) error {
	want := discovery.Fingerprint(key)
	var last keyStatus
	var lastErr error
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		cm, err := s.core.ConfigMaps(s.ns).Get(ctx, agentapi.FederationKeysStatus, metav1.GetOptions{})
		if err != nil {
			lastErr = err
			return apierrors.IsForbidden(err), nil
		}
		last, lastErr = parseKeyStatus(cm), nil
		return sameKeys(last.keys, []string{want}), nil
	})
	if lastErr != nil && apierrors.IsForbidden(lastErr) {
		return s.apiError("read ConfigMap "+agentapi.FederationKeysStatus, lastErr)
	}
	if err != nil || !sameKeys(last.keys, []string{want}) {
		why := ""
		if last.err != "" {
			why = " (" + last.err + ")"
		}
		return fmt.Errorf("%s's agent holds %s, not %s%s: %w (`kubectl -n %s logs deploy/flotilla-agent`)", s.name, describeKeys(last.keys), want, why, err, s.ns)
	}
	fmt.Fprintf(out, "%s's agent holds key %s\n", s.name, want)
	return nil
}
