package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/flotilla-io/flotilla/agent/agentapi"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/identity"
)

func init() {
	register(newTokenCommand)
}

func newTokenCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "token",
		GroupID: groupFederation,
		Short:   "print a join token that lets another cluster join this federation (a secret)",
		Args:    noArgs,
	}
	cluster := clusterFlags(cmd)
	ns := cmd.Flags().String("namespace", agentNamespace, "the agent's namespace")
	stateDir := cmd.Flags().String("state-dir", "", "read the token from the agent's state directory on its gateway host instead of through the API server (e.g. /var/lib/flotilla)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if *stateDir != "" {
			tok, err := agentapi.JoinToken(*stateDir)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok)
			return nil
		}
		cfg, name, err := cluster.restConfig()
		if err != nil {
			return err
		}
		core, err := corev1client.NewForConfig(cfg)
		if err != nil {
			return err
		}
		pub, err := readJoinToken(cmd.Context(), core, *ns, name)
		if err != nil {
			return err
		}
		fmt.Fprintln(cmd.OutOrStdout(), pub.token)
		return nil
	}
	return cmd
}

// published is what a cluster's agent publishes for joiners: its join
// token (a secret), the key in it and the cluster it names.
type published struct {
	token       string
	key         []byte
	seeds       []string
	clusterID   string
	clusterName string
}

// name is the cluster's name and ID, as a person reads it.
func (p published) name() string {
	if p.clusterName == "" {
		return p.clusterID
	}
	return p.clusterName + " (" + p.clusterID + ")"
}

// readJoinToken reads the join token the agent publishes in its
// namespace ns, with the caller's own rights; where names the cluster in
// errors (a context or kubeconfig).
func readJoinToken(ctx context.Context, core corev1client.CoreV1Interface, ns, where string) (published, error) {
	s, err := core.Secrets(ns).Get(ctx, agentapi.JoinSecret, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return published{}, fmt.Errorf("%s: no Secret %s/%s: is Flotilla installed there and its agent running (`kubectl -n %s get pods`), of a version that publishes its join token? (`%s token --state-dir` on its gateway host reads it from the ledger)",
			where, ns, agentapi.JoinSecret, ns, progName)
	case apierrors.IsForbidden(err):
		return published{}, fmt.Errorf("you cannot read %s's join token: %w; ask an admin of that cluster for get on the Secret %s in %s "+
			"(`kubectl -n %s create role flotilla-join-reader --verb=get --resource=secrets --resource-name=%s`, then `kubectl -n %s create rolebinding flotilla-join-reader --role=flotilla-join-reader --user=YOU`), or for the token itself",
			where, err, agentapi.JoinSecret, ns, ns, agentapi.JoinSecret, ns)
	case apierrors.IsUnauthorized(err):
		return published{}, fmt.Errorf("%s: the API server did not accept your credentials: %w (check the kubeconfig's user)", where, err)
	case err != nil && (utilnet.IsConnectionRefused(err) || utilnet.IsTimeout(err)):
		return published{}, fmt.Errorf("%s: cannot reach the API server: %w (is the kubeconfig's cluster the one meant, and up? `kubectl cluster-info` says where it points)", where, err)
	case err != nil:
		return published{}, fmt.Errorf("%s: read Secret %s/%s: %w", where, ns, agentapi.JoinSecret, err)
	}
	raw := string(s.Data[agentapi.SecretToken])
	tok, err := discovery.ParseFederationKey(raw)
	if err != nil {
		return published{}, fmt.Errorf("%s: Secret %s/%s, %q: %w; the agent writes it again when it restarts", where, ns, agentapi.JoinSecret, agentapi.SecretToken, err)
	}
	id := s.Annotations[agentapi.AnnotationClusterID]
	if err := identity.ValidateClusterID(id); err != nil {
		return published{}, fmt.Errorf("%s: Secret %s/%s, annotation %s: %w; the agent writes it again when it restarts", where, ns, agentapi.JoinSecret, agentapi.AnnotationClusterID, err)
	}
	return published{token: raw, key: tok.Key, seeds: tok.Seeds,
		clusterID: id, clusterName: s.Annotations[agentapi.AnnotationClusterName]}, nil
}
