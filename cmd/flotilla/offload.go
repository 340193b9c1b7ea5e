package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
)

func init() {
	register(newOffloadCommand)
	register(newUnoffloadCommand)
}

// offloadName is the one NamespaceOffload the command writes in a
// namespace.
const offloadName = "offload"

func newOffloadCommand() *cobra.Command {
	return withVerbs(&cobra.Command{
		Use:     "offload",
		GroupID: groupOffload,
		Short:   "extend a namespace to the peers a selector picks: offload namespace NS (NamespaceOffload)",
	}, newOffloadNamespaceCommand(offloadNamespace))
}

func newUnoffloadCommand() *cobra.Command {
	ns := &cobra.Command{
		Use:   "namespace NS",
		Short: "stop extending namespace NS; its namespaces on the peers go first",
		Args:  namespaceArg,
	}
	cluster := clusterFlags(ns)
	wait := waitFlag(ns)
	ns.RunE = func(cmd *cobra.Command, args []string) error {
		return unoffloadNamespace(cmd, args[0], *cluster, *wait)
	}
	return withVerbs(&cobra.Command{
		Use:     "unoffload",
		GroupID: groupOffload,
		Short:   "stop extending a namespace; its namespaces on the peers go: unoffload namespace NS",
	}, ns)
}

// namespaceArg: the one argument is a namespace's name.
func namespaceArg(cmd *cobra.Command, args []string) error {
	if err := oneArg("name the namespace: "+cmd.CommandPath()+" NS")(cmd, args); err != nil {
		return err
	}
	if errs := validation.IsDNS1123Label(args[0]); len(errs) > 0 {
		return usageErrorf("namespace %q: %s", args[0], errs[0])
	}
	return nil
}

// offloadFlags are the flags of offload namespace.
type offloadFlags struct {
	cluster                             *clusterRef
	wait                                time.Duration
	selector, mapping, remoteName, pods string
	// account is the agent's ServiceAccount the reflection RoleBinding
	// names.
	account string
	output  string
}

// newOffloadNamespaceCommand is offload namespace NS, which does act
// with the flags as given.
func newOffloadNamespaceCommand(act func(cmd *cobra.Command, ns string, f *offloadFlags) error) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "namespace NS",
		Short: "extend namespace NS to the peers --selector picks: a NamespaceOffload, and progress until Ready",
		Args:  namespaceArg,
	}
	f := &offloadFlags{cluster: clusterFlags(cmd)}
	fs := cmd.Flags()
	fs.DurationVar(&f.wait, "wait", defaultWait, "how long to show progress and wait for the agent's outcome (0: do not wait)")
	fs.StringVar(&f.selector, "selector", "", "labels of the peers to offload to, as this cluster's admin set them on the Peers (region=a,tier=edge; set-based too: 'region in (a,b)'); required: an empty selector selects no peer (every Peer: app.kubernetes.io/managed-by=flotilla)")
	fs.StringVar(&f.mapping, "mapping", string(v1alpha1.MappingDefaultName), "the namespace's name on each peer: DefaultName (NS plus a suffix of this cluster's ID), SameName, or Selected (--remote-name)")
	fs.StringVar(&f.remoteName, "remote-name", "", "the namespace's name on every peer, with --mapping Selected")
	fs.StringVar(&f.pods, "pods", string(v1alpha1.PodsLocalAndRemote), "where the namespace's pods may run: LocalAndRemote, Remote or Local")
	fs.StringVar(&f.account, "agent-account", offload.AgentServiceAccount,
		"the agent's ServiceAccount (namespace:name), which RoleBinding "+offload.ReflectionBinding+" lets read the namespace's ConfigMaps and Secrets")
	fs.StringVarP(&f.output, "output", "o", "", "output format: "+formatList(peerFormats)+"; empty: the progress lines")
	cmd.RunE = func(cmd *cobra.Command, args []string) error { return act(cmd, args[0], f) }
	return cmd
}

// spec checks the flags and returns the NamespaceOffload's spec.
func (f offloadFlags) spec() (v1alpha1.NamespaceOffloadSpec, error) {
	sel, err := parseSelector(f.selector)
	if err != nil {
		return v1alpha1.NamespaceOffloadSpec{}, err
	}
	spec := v1alpha1.NamespaceOffloadSpec{
		ClusterSelector: sel, NamespaceMapping: v1alpha1.NamespaceMapping(f.mapping),
		RemoteName: f.remoteName, PodOffloading: v1alpha1.PodOffloading(f.pods),
	}
	switch spec.NamespaceMapping {
	case v1alpha1.MappingDefaultName, v1alpha1.MappingSameName:
		if spec.RemoteName != "" {
			return spec, fmt.Errorf("--remote-name %q needs --mapping Selected", spec.RemoteName)
		}
	case v1alpha1.MappingSelected:
		if spec.RemoteName == "" {
			return spec, errors.New("--mapping Selected needs --remote-name")
		}
		if errs := validation.IsDNS1123Label(spec.RemoteName); len(errs) > 0 {
			return spec, fmt.Errorf("--remote-name %q: %s", spec.RemoteName, errs[0])
		}
	default:
		return spec, fmt.Errorf("--mapping %q: want DefaultName, SameName or Selected", f.mapping)
	}
	switch spec.PodOffloading {
	case v1alpha1.PodsLocalAndRemote, v1alpha1.PodsRemote, v1alpha1.PodsLocal:
	default:
		return spec, fmt.Errorf("--pods %q: want LocalAndRemote, Remote or Local", f.pods)
	}
	return spec, nil
}

// parseSelector reads --selector, which an offload needs: an empty
// selector selects no peer.
func parseSelector(s string) (*metav1.LabelSelector, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("--selector is required: an empty selector selects no peer. Select by labels you put on the Peers " +
			"(kubectl label peer ID region=eu), or every Peer with --selector app.kubernetes.io/managed-by=flotilla; " +
			"a label a peer announces about itself (status.announcedLabels) selects it only once you copy it onto its Peer")
	}
	sel, err := metav1.ParseToLabelSelector(s)
	if err != nil {
		return nil, fmt.Errorf("--selector %q: %v (want key=value[,key=value...] over the peers' labels, as `kubectl get peers --show-labels` shows them)", s, err)
	}
	if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
		return nil, fmt.Errorf("--selector %q: %v", s, err)
	}
	return sel, nil
}

// offloadNamespace writes the NamespaceOffload of ns, with what it needs
// around it, and shows progress until the agent's outcome.
func offloadNamespace(cmd *cobra.Command, ns string, f *offloadFlags) error {
	ctx, stdout := cmd.Context(), cmd.OutOrStdout()
	out, progress, err := resultOutput(f.output, stdout, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	spec, err := f.spec()
	if err != nil {
		return err
	}
	c, err := f.cluster.client()
	if err != nil {
		return err
	}
	bound, err := bindReflection(ctx, c, ns, f.account)
	if err != nil {
		return err
	}
	fmt.Fprintf(progress, "namespace %s: RoleBinding %s %s (the agent may read its ConfigMaps and Secrets)\n", ns, offload.ReflectionBinding, bound)
	gen, verb, err := writeOffload(ctx, c, ns, spec)
	if err != nil {
		return err
	}
	fmt.Fprintf(progress, "namespace %s: NamespaceOffload %s %s (generation %d)\n", ns, offloadName, verb, gen)
	// After the NamespaceOffload: the webhook places pods by what it says.
	labelled, err := labelOffloaded(ctx, c, ns, true)
	if err != nil {
		return err
	}
	if labelled {
		fmt.Fprintf(progress, "namespace %s: labelled %s=true (its new pods go through the placement webhook)\n", ns, offload.LabelOffloaded)
	}
	if f.wait != 0 {
		if err := waitOffloaded(ctx, c, progress, ns, gen, f.wait); err != nil {
			return err
		}
	}
	if out == outputTable {
		return nil
	}
	var x v1alpha1.NamespaceOffload
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: offloadName}, &x); err != nil {
		return fmt.Errorf("read NamespaceOffload %s/%s: %w", ns, offloadName, err)
	}
	if out == outputWide {
		return writeOffloads(stdout, []v1alpha1.NamespaceOffload{x}, outputWide)
	}
	return writeObject(stdout, &x, "NamespaceOffload", "namespaceoffload", out)
}

// bindReflection makes, with the caller's rights, the RoleBinding that
// lets the agent's account read the ConfigMaps and Secrets of ns
// (docs/services.md, "Reflection's rights"); it says whether it was
// created or kept. One of that name that is not ours and binds
// something else is an error: never touched.
func bindReflection(ctx context.Context, c client.Client, ns, account string) (string, error) {
	want, err := offload.ReflectionRoleBinding(ns, account)
	if err != nil {
		return "", fmt.Errorf("--agent-account: %w", err)
	}
	err = c.Create(ctx, want)
	switch {
	case err == nil:
		return "created", nil
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("namespace %s: %w (create the namespace first)", ns, err)
	case apierrors.IsForbidden(err):
		return "", fmt.Errorf("create RoleBinding %s/%s: %w (it grants the agent %s: run this as someone who may read ConfigMaps and Secrets in %s, or may bind ClusterRole %s); nothing was offloaded",
			ns, offload.ReflectionBinding, err, offload.ReflectionClusterRole, ns, offload.ReflectionClusterRole)
	case !apierrors.IsAlreadyExists(err):
		return "", fmt.Errorf("create RoleBinding %s/%s: %w", ns, offload.ReflectionBinding, err)
	}
	var have rbacv1.RoleBinding
	if err := c.Get(ctx, client.ObjectKeyFromObject(want), &have); err != nil {
		return "", fmt.Errorf("read RoleBinding %s/%s: %w", ns, offload.ReflectionBinding, err)
	}
	if have.RoleRef == want.RoleRef && slices.Contains(have.Subjects, want.Subjects[0]) {
		return "kept", nil
	}
	if have.Labels[v1alpha1.LabelManagedBy] != v1alpha1.ManagedByValue || have.RoleRef != want.RoleRef {
		return "", fmt.Errorf("RoleBinding %s/%s is there and does not bind ClusterRole %s to %s: it is not this command's, and left alone; remove or rename it, then offload again",
			ns, offload.ReflectionBinding, offload.ReflectionClusterRole, account)
	}
	// Ours, for another account (--agent-account changed).
	have.Subjects = want.Subjects
	if err := c.Update(ctx, &have); err != nil {
		return "", fmt.Errorf("update RoleBinding %s/%s: %w", ns, offload.ReflectionBinding, err)
	}
	return "updated", nil
}

// unbindReflection removes the RoleBinding bindReflection made in ns;
// one not labelled as ours (made by hand) stays.
func unbindReflection(ctx context.Context, c client.Client, ns string) (bool, error) {
	var have rbacv1.RoleBinding
	switch err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: offload.ReflectionBinding}, &have); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read RoleBinding %s/%s: %w", ns, offload.ReflectionBinding, err)
	}
	if have.Labels[v1alpha1.LabelManagedBy] != v1alpha1.ManagedByValue {
		return false, nil
	}
	err := c.Delete(ctx, &have, client.Preconditions{UID: &have.UID})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return false, fmt.Errorf("delete RoleBinding %s/%s: %w", ns, offload.ReflectionBinding, err)
	}
	return err == nil, nil
}

// labelOffloaded sets LabelOffloaded=true on namespace ns, or removes
// it, with the caller's rights, and says whether it changed anything.
// The placement webhook sees only the pods of namespaces so labelled, and
// the agent may not set the label itself (an admission policy refuses
// it): it is the administrator's choice, made here.
func labelOffloaded(ctx context.Context, c client.Client, ns string, on bool) (bool, error) {
	n := offload.MetadataOf(corev1.SchemeGroupVersion.WithKind("Namespace"))
	switch err := c.Get(ctx, client.ObjectKey{Name: ns}, n); {
	case apierrors.IsNotFound(err) && !on:
		return false, nil
	case apierrors.IsNotFound(err):
		return false, fmt.Errorf("namespace %s: %w (create the namespace first)", ns, err)
	case err != nil:
		return false, fmt.Errorf("read namespace %s: %w", ns, err)
	}
	if v, has := n.Labels[offload.LabelOffloaded]; (on && v == "true") || (!on && !has) {
		return false, nil
	}
	value, verb, fix := any("true"), "label", offload.LabelOffloaded+"=true"
	if !on {
		value, verb, fix = nil, "unlabel", offload.LabelOffloaded+"-"
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{offload.LabelOffloaded: value}}})
	if err != nil {
		return false, err
	}
	err = c.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch))
	switch {
	case apierrors.IsForbidden(err):
		return false, fmt.Errorf("%s namespace %s %s: %w (only someone who may patch namespaces sets the label that sends its pods to the placement webhook; "+
			"ask an administrator to run `kubectl label namespace %s %s`)", verb, ns, offload.LabelOffloaded, err, ns, fix)
	case err != nil:
		return false, fmt.Errorf("%s namespace %s %s: %w", verb, ns, offload.LabelOffloaded, err)
	}
	return true, nil
}

// writeOffload creates the NamespaceOffload in ns, or sets its spec, and
// returns the generation to wait for.
func writeOffload(ctx context.Context, c client.Client, ns string, spec v1alpha1.NamespaceOffloadSpec) (int64, string, error) {
	var gen int64
	verb := "updated"
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var o v1alpha1.NamespaceOffload
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: offloadName}, &o)
		switch {
		case apierrors.IsNotFound(err):
			o = v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: offloadName}, Spec: spec}
			verb = "created"
			err = c.Create(ctx, &o)
		case err == nil:
			if o.DeletionTimestamp != nil {
				return fmt.Errorf("NamespaceOffload %s/%s is being deleted: wait for `flotilla unoffload namespace %s` to finish, then offload again", ns, offloadName, ns)
			}
			o.Spec = spec
			err = c.Update(ctx, &o)
		}
		gen = o.Generation
		return err
	})
	switch {
	case apierrors.IsNotFound(err):
		return 0, "", fmt.Errorf("namespace %s: %w (create the namespace first)", ns, err)
	case meta.IsNoMatchError(err):
		return 0, "", fmt.Errorf("this cluster does not know NamespaceOffloads: %w (is the agent installed? it installs the CRDs)", err)
	case err != nil:
		return 0, "", fmt.Errorf("write NamespaceOffload %s/%s: %w", ns, offloadName, err)
	}
	return gen, verb, nil
}

// waitOffloaded shows progress until the agent has acted on generation
// gen and the namespace is Ready, or failed.
func waitOffloaded(ctx context.Context, c client.WithWatch, w io.Writer, ns string, gen int64, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p := &progress{w: w, lines: map[string]string{}}
	var last *v1alpha1.NamespaceOffload
	_, err := watchtools.UntilWithSync(ctx, offloadWatch(c, ns), &v1alpha1.NamespaceOffload{}, nil, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Deleted {
			return false, fmt.Errorf("NamespaceOffload %s/%s was deleted", ns, offloadName)
		}
		o, ok := ev.Object.(*v1alpha1.NamespaceOffload)
		if !ok || o.Status.ObservedGeneration < gen {
			return false, nil
		}
		last = o
		p.show(o)
		return settled(o.Status.Phase), nil
	})
	if last == nil {
		if err != nil && ctx.Err() == nil {
			return err
		}
		return fmt.Errorf("the agent has not acted on the NamespaceOffload within %s (is it running? `kubectl -n flotilla-system logs deploy/flotilla-agent`)", timeout)
	}
	if last.Status.Phase == v1alpha1.OffloadReady {
		fmt.Fprintf(w, "Ready: namespace %s extends to %d cluster(s)\n", ns, len(last.Status.Clusters))
		return nil
	}
	if err != nil && ctx.Err() == nil {
		return err
	}
	if !settled(last.Status.Phase) {
		return fmt.Errorf("not Ready after %s: %s%s", timeout, last.Status.Phase, failures(last))
	}
	return fmt.Errorf("%s%s", last.Status.Phase, failures(last))
}

// settled: the agent has reached an outcome a person should read.
func settled(p v1alpha1.OffloadPhase) bool {
	switch p {
	case v1alpha1.OffloadReady, v1alpha1.OffloadSomeFailed, v1alpha1.OffloadAllFailed, v1alpha1.OffloadNoClusterSelected:
		return true
	}
	return false
}

// failures lists the clusters that are not Ready, with their reasons.
func failures(o *v1alpha1.NamespaceOffload) string {
	if o.Status.Phase == v1alpha1.OffloadNoClusterSelected {
		return ": no peer matches the selector (`kubectl get peers --show-labels`; with no selector, peers that granted this cluster offloading)"
	}
	var out []string
	for _, c := range o.Status.Clusters {
		if r := meta.FindStatusCondition(c.Conditions, offload.ConditionReady); r != nil && r.Status != metav1.ConditionTrue {
			out = append(out, fmt.Sprintf("%s: %s (%s)", clusterOf(c), r.Reason, r.Message))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return ": " + strings.Join(out, "; ")
}

// progress prints each cluster's line and the phase when they change.
type progress struct {
	w     io.Writer
	phase v1alpha1.OffloadPhase
	lines map[string]string
}

func (p *progress) show(o *v1alpha1.NamespaceOffload) {
	clusters := append([]v1alpha1.ClusterOffload(nil), o.Status.Clusters...)
	sort.Slice(clusters, func(i, j int) bool { return clusters[i].ClusterID < clusters[j].ClusterID })
	for _, c := range clusters {
		r := meta.FindStatusCondition(c.Conditions, offload.ConditionReady)
		if r == nil {
			continue
		}
		remote := c.RemoteNamespace
		if remote == "" {
			remote = "-"
		}
		line := fmt.Sprintf("  %s  %s  %s: %s", clusterOf(c), remote, r.Reason, r.Message)
		if p.lines[c.ClusterID] != line {
			p.lines[c.ClusterID] = line
			fmt.Fprintln(p.w, line)
		}
	}
	if o.Status.Phase != p.phase {
		p.phase = o.Status.Phase
		fmt.Fprintf(p.w, "phase %s\n", p.phase)
	}
}

func clusterOf(c v1alpha1.ClusterOffload) string {
	if c.ClusterName == "" {
		return c.ClusterID
	}
	return c.ClusterName + " (" + c.ClusterID + ")"
}

// offloadWatch lists and watches the one NamespaceOffload in ns.
func offloadWatch(c client.WithWatch, ns string) toolscache.ListerWatcher {
	field := "metadata.name=" + offloadName
	return &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = field
			var l v1alpha1.NamespaceOffloadList
			err := c.List(ctx, &l, client.InNamespace(ns), &client.ListOptions{Raw: &opts})
			return &l, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = field
			return c.Watch(ctx, &v1alpha1.NamespaceOffloadList{}, client.InNamespace(ns), &client.ListOptions{Raw: &opts})
		},
	}
}

// unoffloadNamespace deletes the NamespaceOffload of ns, with what
// offloadNamespace made around it, and shows progress until it is gone.
func unoffloadNamespace(cmd *cobra.Command, ns string, cluster clusterRef, wait time.Duration) error {
	ctx, stdout, stderr := cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr()
	c, err := cluster.client()
	if err != nil {
		return err
	}
	// First: new pods stay here from now on, so no webhook places them on
	// a provider whose namespace is going.
	switch unlabelled, err := labelOffloaded(ctx, c, ns, false); {
	case apierrors.IsForbidden(errors.Unwrap(err)):
		fmt.Fprintf(stderr, "warning: %v\n", err)
	case err != nil:
		return err
	case unlabelled:
		fmt.Fprintf(stdout, "namespace %s: label %s removed (its new pods stay in this cluster)\n", ns, offload.LabelOffloaded)
	}
	err = c.Delete(ctx, &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: offloadName}})
	notOffloaded := apierrors.IsNotFound(err)
	switch {
	case meta.IsNoMatchError(err):
		return fmt.Errorf("this cluster does not know NamespaceOffloads: %w (is the agent installed?)", err)
	case err != nil && !notOffloaded:
		return fmt.Errorf("delete NamespaceOffload %s/%s: %w", ns, offloadName, err)
	}
	// The agent reads nothing more of a namespace whose offloading is
	// being deleted: its rights there go at once.
	unbound, err := unbindReflection(ctx, c, ns)
	if err != nil {
		return err
	}
	if unbound {
		fmt.Fprintf(stdout, "namespace %s: RoleBinding %s deleted (the agent may no longer read its ConfigMaps and Secrets)\n", ns, offload.ReflectionBinding)
	}
	if notOffloaded {
		fmt.Fprintf(stdout, "namespace %s is not offloaded\n", ns)
		return nil
	}
	fmt.Fprintf(stdout, "namespace %s: NamespaceOffload %s deleted; its namespaces on the peers go first\n", ns, offloadName)
	if wait == 0 {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	p := &progress{w: stdout, lines: map[string]string{}}
	var last *v1alpha1.NamespaceOffload
	gone := func(store toolscache.Store) (bool, error) {
		_, exists, err := store.GetByKey(ns + "/" + offloadName)
		return !exists, err
	}
	_, err = watchtools.UntilWithSync(wctx, offloadWatch(c, ns), &v1alpha1.NamespaceOffload{}, gone, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Deleted {
			return true, nil
		}
		if o, ok := ev.Object.(*v1alpha1.NamespaceOffload); ok {
			last = o
			p.show(o)
		}
		return false, nil
	})
	if err != nil {
		if wctx.Err() != nil && last != nil {
			return fmt.Errorf("still there after %s: %s%s", wait, last.Status.Phase, failures(last))
		}
		if wctx.Err() != nil {
			return fmt.Errorf("still there after %s (is the agent running? it removes the namespaces on the peers, then the NamespaceOffload)", wait)
		}
		return err
	}
	fmt.Fprintf(stdout, "namespace %s is no longer offloaded\n", ns)
	return nil
}
