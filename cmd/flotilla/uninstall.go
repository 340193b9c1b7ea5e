package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/deploy"
)

func init() { register(newUninstallCommand) }

func newUninstallCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "uninstall",
		GroupID: groupFederation,
		Short:   "delete what deploy/ installed, keeping the CRDs other implementations share",
		Long: `Deletes the objects deploy/ (or a release's flotilla.yaml) installs, the
agent first and its namespace and CRDs last, with every Peer and
NamespaceOffload. The CRDs of APIs other implementations share (the
Multi-Cluster Services API's ServiceExport and ServiceImport, the About
API's ClusterProperty) stay, with every object in them, unless
--delete-shared-crds is given; it says which it kept.

Unoffload namespaces and revoke grants first (docs/install.md,
"Uninstalling"); run flotilla cleanup on the gateway node afterwards.`,
		Args: noArgs,
	}
	cluster := clusterFlags(cmd)
	shared := cmd.Flags().Bool("delete-shared-crds", false, "also delete the shared CRDs (ServiceExport, ServiceImport, ClusterProperty) and every object of theirs, whoever made it")
	wait := cmd.Flags().Duration("wait", defaultWait, "how long to wait until what was deleted is gone (0: do not wait)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, _, err := cluster.restConfig()
		if err != nil {
			return err
		}
		c, err := client.New(cfg, client.Options{})
		if err != nil {
			return fmt.Errorf("client for %s: %w", cluster.name(), err)
		}
		return uninstall(cmd.Context(), cmd.OutOrStdout(), c, *shared, *wait)
	}
	return cmd
}

// uninstall deletes deploy/'s objects in the reverse of their install
// order, skipping the shared CRDs unless deleteShared, and waits up to
// wait until every object it deleted is gone.
func uninstall(ctx context.Context, out io.Writer, c client.Client, deleteShared bool, wait time.Duration) error {
	objs, err := deploy.Objects()
	if err != nil {
		return err
	}
	slices.Reverse(objs)
	var deleted, kept []*unstructured.Unstructured
	for _, obj := range objs {
		if deploy.SharedCRD(obj) && !deleteShared {
			kept = append(kept, obj)
			continue
		}
		err := c.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground))
		switch {
		case err == nil:
			deleted = append(deleted, obj)
			fmt.Fprintf(out, "deleted %s\n", describe(obj))
		case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
			fmt.Fprintf(out, "absent  %s\n", describe(obj))
		default:
			return fmt.Errorf("delete %s: %w; nothing after it deleted, run again once it is fixed", describe(obj), err)
		}
	}
	for _, obj := range kept {
		fmt.Fprintf(out, "kept    %s: other implementations may use it; --delete-shared-crds deletes it and every object of its kind\n", describe(obj))
	}
	if wait == 0 || len(deleted) == 0 {
		return nil
	}
	return waitGone(ctx, out, c, deleted, wait)
}

// waitGone waits until every object in objs is gone: a namespace while
// its objects are deleted, a CRD while its objects are.
func waitGone(ctx context.Context, out io.Writer, c client.Client, objs []*unstructured.Unstructured, timeout time.Duration) error {
	var left *unstructured.Unstructured
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		for _, obj := range objs {
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(obj.GroupVersionKind())
			err := c.Get(ctx, client.ObjectKeyFromObject(obj), got)
			switch {
			case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
				continue
			case err != nil:
				return false, fmt.Errorf("read %s: %w", describe(obj), err)
			}
			left = obj
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		if left != nil {
			return fmt.Errorf("%s is not gone after %s (kubectl get %s -o yaml shows what holds it); run uninstall again to wait longer", describe(left), timeout, kindName(left))
		}
		return err
	}
	fmt.Fprintf(out, "gone: %d objects\n", len(objs))
	return nil
}

// describe names an object as kubectl's messages do.
func describe(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return obj.GetKind() + " " + ns + "/" + obj.GetName()
	}
	return obj.GetKind() + " " + obj.GetName()
}

func kindName(obj *unstructured.Unstructured) string {
	s := obj.GetKind() + "/" + obj.GetName()
	if ns := obj.GetNamespace(); ns != "" {
		s = "-n " + ns + " " + s
	}
	return s
}
