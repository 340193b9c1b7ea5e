package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// clusterRef names a cluster as kubectl does: a kubeconfig (empty:
// $KUBECONFIG, else ~/.kube/config) and one of its contexts (empty: its
// current context).
type clusterRef struct {
	kubeconfig, context string
}

// clusterFlags defines --kubeconfig and --context, kubectl's, on a
// command that talks to one cluster. kubectl does not pass its own to
// plugins: kubectl flotilla takes them itself.
func clusterFlags(cmd *cobra.Command) *clusterRef {
	r := &clusterRef{}
	cmd.Flags().StringVar(&r.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster (default: $KUBECONFIG or ~/.kube/config)")
	cmd.Flags().StringVar(&r.context, "context", "", "the kubeconfig context to use (default: its current context)")
	return r
}

// restConfig loads the cluster's client configuration, as kubectl does
// (client-go's loading rules), and the name of its context.
func (r clusterRef) restConfig() (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = r.kubeconfig
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: r.context})
	raw, rawErr := loader.RawConfig()
	if rawErr != nil {
		return nil, "", fmt.Errorf("kubeconfig %s: %w", r.where(), rawErr)
	}
	if _, ok := raw.Contexts[r.context]; r.context != "" && !ok {
		return nil, "", r.noContext(slices.Sorted(maps.Keys(raw.Contexts)))
	}
	cfg, err := loader.ClientConfig()
	switch {
	case clientcmd.IsEmptyConfig(err):
		return nil, "", fmt.Errorf("no cluster: pass --kubeconfig or set KUBECONFIG (%s names none, and this is not a pod in a cluster)", r.where())
	case err != nil:
		return nil, "", fmt.Errorf("kubeconfig %s: %w", r.where(), err)
	}
	name := r.context
	if name == "" {
		name = raw.CurrentContext
	}
	return cfg, name, nil
}

func (r clusterRef) noContext(have []string) error {
	if len(have) == 0 {
		return fmt.Errorf("no context %q: %s has no contexts; pass the kubeconfig that has it with --kubeconfig", r.context, r.where())
	}
	return fmt.Errorf("no context %q in %s; its contexts are: %s (`kubectl config get-contexts`)", r.context, r.where(), strings.Join(have, ", "))
}

// where names the kubeconfig for an error: the path given, else where
// kubectl looks.
func (r clusterRef) where() string {
	if r.kubeconfig != "" {
		return r.kubeconfig
	}
	return "$KUBECONFIG or ~/.kube/config"
}

// name is how an error names the cluster until it names itself.
func (r clusterRef) name() string {
	switch {
	case r.context != "" && r.kubeconfig != "":
		return r.kubeconfig + " (context " + r.context + ")"
	case r.context != "":
		return "context " + r.context
	case r.kubeconfig != "":
		return r.kubeconfig
	}
	return "the default kubeconfig ($KUBECONFIG or ~/.kube/config)"
}

// client reads and writes the cluster's flotilla.io objects, and the
// RoleBindings offload makes.
func (r clusterRef) client() (client.WithWatch, error) {
	cfg, _, err := r.restConfig()
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{v1alpha1.AddToScheme, rbacv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	return client.NewWithWatch(cfg, client.Options{Scheme: scheme})
}

// clusterList is --kubeconfig and --context, each repeatable, on a
// command that talks to several clusters.
type clusterList struct {
	kubeconfigs, contexts []string
}

func clusterListFlags(cmd *cobra.Command, what string) *clusterList {
	l := &clusterList{}
	cmd.Flags().StringArrayVar(&l.kubeconfigs, "kubeconfig", nil, "kubeconfig of a cluster of the federation; repeat it "+what+" (default: $KUBECONFIG or ~/.kube/config)")
	cmd.Flags().StringArrayVar(&l.contexts, "context", nil, "a kubeconfig context; repeat it "+what+": one --context per --kubeconfig, or several contexts of one kubeconfig (default: the current context)")
	return l
}

// refs pairs the flags into clusters: one --context per --kubeconfig, or
// every context in one kubeconfig; neither: the default kubeconfig's
// current context.
func (l clusterList) refs() ([]clusterRef, error) {
	nk, nc := len(l.kubeconfigs), len(l.contexts)
	var refs []clusterRef
	switch {
	case nk == 0 && nc == 0:
		refs = []clusterRef{{}}
	case nc == 0:
		for _, k := range l.kubeconfigs {
			refs = append(refs, clusterRef{kubeconfig: k})
		}
	case nk <= 1:
		k := ""
		if nk == 1 {
			k = l.kubeconfigs[0]
		}
		for _, c := range l.contexts {
			refs = append(refs, clusterRef{kubeconfig: k, context: c})
		}
	case nk == nc:
		for i, k := range l.kubeconfigs {
			refs = append(refs, clusterRef{kubeconfig: k, context: l.contexts[i]})
		}
	default:
		return nil, usageErrorf("%d --kubeconfig and %d --context: give one --context per --kubeconfig, or several contexts of one kubeconfig", nk, nc)
	}
	return refs, nil
}
