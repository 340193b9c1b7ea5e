package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	aboutv1alpha1 "github.com/flotilla-io/flotilla/api/about/v1alpha1"
	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/fabric/fabricapi"
	"github.com/flotilla-io/flotilla/internal/podhttp"
	"github.com/flotilla-io/flotilla/observe/trace/collect"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/peering/protocol"
)

func init() { register(newGatherCommand) }

func newGatherCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "gather",
		GroupID: groupDiagnose,
		Short:   "write a support bundle of this cluster's install, credentials redacted: -o DIR or FILE.tar.gz",
		Long: `Write a support bundle of this cluster's install, read with your own
rights: flotilla info, versions, the agent's and the fabric's pod logs
(the previous container's too) and metrics, Peers, NamespaceOffloads,
grants (the Peers' offloading and the tenant namespaces), events of the
namespaces Flotilla works in, the data path's trace report, Nodes, and
the agent's Deployment, DaemonSet and ConfigMaps.

Secrets are never read: the bundle lists the names of those in the
agent's namespace only. Everything written is redacted: tokens (JWTs,
bearer tokens, join tokens), 32-byte keys in base64 (WireGuard's, the
federation key; public keys too), PEM private keys and fields named for a
credential show as [redacted...]. What cannot be read is listed in
NOTES.txt, not fatal. Progress goes to stderr.

-o names a directory, or a file ending .tar.gz (default:
flotilla-gather-<context>-<time>.tar.gz here).`,
		Args: noArgs,
	}
	cluster := clusterFlags(cmd)
	ns := cmd.Flags().String("namespace", agentNamespace, "the agent's namespace")
	dest := cmd.Flags().StringP("output", "o", "", "where to write: a directory, or a file ending .tar.gz (default: flotilla-gather-<context>-<time>.tar.gz)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, context, err := cluster.restConfig()
		if err != nil {
			return err
		}
		to := *dest
		if to == "" {
			to = fmt.Sprintf("flotilla-gather-%s-%s.tar.gz", safeName(orDash(context)), time.Now().UTC().Format("20060102T150405Z"))
		}
		b, err := openBundle(to)
		if err != nil {
			return err
		}
		g := &gatherer{cfg: cfg, ns: *ns, context: context, b: b, progress: cmd.ErrOrStderr()}
		err = g.gather(cmd.Context())
		if cerr := b.close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (%d files", to, g.files)
		if len(g.notes) > 0 {
			fmt.Fprintf(cmd.ErrOrStderr(), "; %d things not read: see NOTES.txt", len(g.notes))
		}
		fmt.Fprintln(cmd.ErrOrStderr(), ")")
		fmt.Fprintln(cmd.OutOrStdout(), to)
		return nil
	}
	return cmd
}

// safeName makes s usable in a file name.
func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

// gatherer writes one cluster's bundle.
type gatherer struct {
	cfg      *rest.Config
	ns       string
	context  string
	b        bundle
	c        client.Client
	progress io.Writer
	files    int
	notes    []string
}

// note records what could not be read.
func (g *gatherer) note(what string, err error) {
	g.notes = append(g.notes, fmt.Sprintf("%s: %v", what, err))
}

// write adds a file, redacted.
func (g *gatherer) write(name string, data []byte) {
	if err := g.b.add(name, redact(data)); err != nil {
		g.note("write "+name, err)
		return
	}
	g.files++
}

func (g *gatherer) writeYAML(name string, v any) {
	out, err := yaml.Marshal(v)
	if err != nil {
		g.note(name, err)
		return
	}
	g.write(name, out)
}

func (g *gatherer) step(format string, args ...any) {
	fmt.Fprintf(g.progress, "gather: "+format+"\n", args...)
}

func (g *gatherer) gather(ctx context.Context) error {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, v1alpha1.AddToScheme, aboutv1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	var err error
	if g.c, err = client.New(g.cfg, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	g.step("info and versions")
	info, err := readInstall(ctx, g.cfg, g.ns)
	if err != nil {
		return err
	}
	info.Cluster.Context = g.context
	var text strings.Builder
	_ = writeInfo(&text, info)
	g.write("info.txt", []byte(text.String()))
	g.writeYAML("info.yaml", info)
	versions := map[string]any{"client": protocol.Build()}
	for _, p := range info.Agent.Pods {
		versions["agent "+p.Name] = map[string]string{"version": p.Version, "commit": p.Commit}
	}
	g.writeYAML("versions.yaml", versions)

	g.step("Peers, NamespaceOffloads and grants")
	namespaces := g.federationObjects(ctx)
	g.step("the agent's objects and the names of its Secrets")
	g.agentObjects(ctx)
	g.step("events of %d namespace(s)", len(namespaces))
	for _, n := range namespaces {
		g.events(ctx, n)
	}
	g.step("logs and metrics of the agent's and the fabric's pods")
	g.podsOf(ctx, "agent", agentDeployment, func(ctx context.Context) (*metav1.LabelSelector, error) {
		var d appsv1.Deployment
		err := g.c.Get(ctx, client.ObjectKey{Namespace: g.ns, Name: agentDeployment}, &d)
		return d.Spec.Selector, err
	}, metricsPort, 9470)
	g.podsOf(ctx, "fabric", fabricapi.DaemonSetName, func(ctx context.Context) (*metav1.LabelSelector, error) {
		var d appsv1.DaemonSet
		err := g.c.Get(ctx, client.ObjectKey{Namespace: g.ns, Name: fabricapi.DaemonSetName}, &d)
		return d.Spec.Selector, err
	}, metricsPort, fabricapi.MetricsPort)
	g.step("the data path's trace report")
	if report, err := collect.Collect(ctx, collect.Source{Name: g.context, Config: g.cfg}, collect.Ends{}); err != nil {
		g.note("trace report", err)
	} else {
		g.writeYAML("trace.yaml", report)
	}
	if len(g.notes) > 0 {
		g.write("NOTES.txt", []byte(strings.Join(g.notes, "\n")+"\n"))
	}
	return ctx.Err()
}

// federationObjects writes the Peers, NamespaceOffloads, grants and
// Nodes, and returns the namespaces whose events matter: the agent's,
// the offloaded ones, the tenant and mirrored ones.
func (g *gatherer) federationObjects(ctx context.Context) []string {
	namespaces := []string{g.ns}
	var peers v1alpha1.PeerList
	if err := g.c.List(ctx, &peers); err != nil {
		g.note("Peers", err)
	} else {
		g.writeYAML("peers.yaml", stripped(peers.Items))
		g.writeYAML("grants.yaml", grantsOf(peers.Items))
	}
	var offloads v1alpha1.NamespaceOffloadList
	if err := g.c.List(ctx, &offloads); err != nil {
		g.note("NamespaceOffloads", err)
	} else {
		g.writeYAML("namespaceoffloads.yaml", stripped(offloads.Items))
		for _, o := range offloads.Items {
			namespaces = append(namespaces, o.Namespace)
		}
	}
	for _, label := range []string{offload.LabelTenant, v1alpha1.LabelMirroredFrom} {
		var list corev1.NamespaceList
		if err := g.c.List(ctx, &list, client.HasLabels{label}); err != nil {
			g.note("namespaces labelled "+label, err)
			continue
		}
		var names []string
		for _, n := range list.Items {
			names = append(names, n.Name+" "+labelsOf(n.Labels))
			namespaces = append(namespaces, n.Name)
		}
		g.write("namespaces-"+safeName(label[strings.LastIndex(label, "/")+1:])+".txt", []byte(strings.Join(names, "\n")+"\n"))
	}
	var nodes corev1.NodeList
	if err := g.c.List(ctx, &nodes); err != nil {
		g.note("Nodes", err)
	} else {
		for i := range nodes.Items {
			nodes.Items[i].Status.Images = nil
		}
		g.writeYAML("nodes.yaml", stripped(nodes.Items))
	}
	sort.Strings(namespaces)
	return compactStrings(namespaces)
}

func compactStrings(s []string) []string {
	var out []string
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

func labelsOf(l map[string]string) string {
	var kv []string
	for k, v := range l {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return strings.Join(kv, ",")
}

// stripped drops what is noise in a bundle: managedFields, and the
// last-applied annotation, which may repeat a whole manifest.
func stripped[T any, PT interface {
	*T
	client.Object
}](items []T) []T {
	for i := range items {
		o := PT(&items[i])
		o.SetManagedFields(nil)
		a := o.GetAnnotations()
		delete(a, corev1.LastAppliedConfigAnnotation)
		o.SetAnnotations(a)
	}
	return items
}

// peerGrant is one Peer's offloading, both ways.
type peerGrant struct {
	Peer       string             `json:"peer"`
	Cluster    string             `json:"cluster,omitempty"`
	Spec       v1alpha1.PeerSpec  `json:"spec"`
	Offloading any                `json:"offloading,omitempty"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	Labels     map[string]string  `json:"labels,omitempty"`
}

func grantsOf(peers []v1alpha1.Peer) []peerGrant {
	out := make([]peerGrant, 0, len(peers))
	for _, p := range peers {
		g := peerGrant{Peer: p.Name, Cluster: p.Status.ClusterName, Spec: p.Spec, Labels: p.Labels}
		if p.Status.Offloading != nil {
			g.Offloading = p.Status.Offloading
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1alpha1.ConditionOffloadGranted || c.Type == v1alpha1.ConditionOffloadCredential {
				g.Conditions = append(g.Conditions, c)
			}
		}
		out = append(out, g)
	}
	return out
}

// agentObjects writes the agent's Deployment and DaemonSet, its
// namespace's ConfigMaps, and the names of its Secrets, read as
// metadata only.
func (g *gatherer) agentObjects(ctx context.Context) {
	var ds appsv1.DeploymentList
	if err := g.c.List(ctx, &ds, client.InNamespace(g.ns)); err != nil {
		g.note("Deployments in "+g.ns, err)
	} else {
		g.writeYAML("objects/deployments.yaml", stripped(ds.Items))
	}
	var dss appsv1.DaemonSetList
	if err := g.c.List(ctx, &dss, client.InNamespace(g.ns)); err != nil {
		g.note("DaemonSets in "+g.ns, err)
	} else {
		g.writeYAML("objects/daemonsets.yaml", stripped(dss.Items))
	}
	var cms corev1.ConfigMapList
	if err := g.c.List(ctx, &cms, client.InNamespace(g.ns)); err != nil {
		g.note("ConfigMaps in "+g.ns, err)
	} else {
		g.writeYAML("objects/configmaps.yaml", stripped(cms.Items))
	}
	secrets := &metav1.PartialObjectMetadataList{}
	secrets.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("SecretList"))
	if err := g.c.List(ctx, secrets, client.InNamespace(g.ns)); err != nil {
		g.note("the names of the Secrets in "+g.ns, err)
		return
	}
	var names []string
	for _, s := range secrets.Items {
		names = append(names, s.Name)
	}
	sort.Strings(names)
	g.write("objects/secret-names.txt", []byte(strings.Join(names, "\n")+"\n"))
}

// events writes the events of namespace ns, oldest first.
func (g *gatherer) events(ctx context.Context, ns string) {
	var list corev1.EventList
	if err := g.c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		g.note("events in "+ns, err)
		return
	}
	sort.Slice(list.Items, func(i, j int) bool { return eventTime(list.Items[i]).Before(eventTime(list.Items[j])) })
	var b strings.Builder
	for _, e := range list.Items {
		fmt.Fprintf(&b, "%s\t%s\t%s/%s\t%s\tx%d\t%s\n", eventTime(e).UTC().Format(time.RFC3339), e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, max(e.Count, 1), e.Message)
	}
	g.write("events/"+ns+".txt", []byte(b.String()))
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// podsOf writes the logs of every container of the pods selector picks
// (the previous container's too) and each pod's metrics page.
func (g *gatherer) podsOf(ctx context.Context, what, owner string, selector func(context.Context) (*metav1.LabelSelector, error), portName string, port int) {
	sel, err := selector(ctx)
	if err != nil {
		g.note(what+" "+owner, err)
		return
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		g.note(what+" "+owner, err)
		return
	}
	var pods corev1.PodList
	if err := g.c.List(ctx, &pods, client.InNamespace(g.ns), client.MatchingLabelsSelector{Selector: s}); err != nil {
		g.note(what+" pods", err)
		return
	}
	logs, err := podLogClient(g.cfg)
	if err != nil {
		g.note(what+" logs", err)
		return
	}
	g.writeYAML(what+"/pods.yaml", stripped(pods.Items))
	for _, p := range pods.Items {
		for _, c := range p.Spec.Containers {
			restarted := false
			for _, st := range p.Status.ContainerStatuses {
				restarted = restarted || (st.Name == c.Name && st.RestartCount > 0)
			}
			for _, previous := range []bool{false, true} {
				if previous && !restarted {
					continue
				}
				name := fmt.Sprintf("%s/%s/%s.log", what, p.Name, c.Name)
				if previous {
					name = fmt.Sprintf("%s/%s/%s.previous.log", what, p.Name, c.Name)
				}
				out, err := logs.Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name, Previous: previous}).DoRaw(ctx)
				if err != nil {
					g.note("logs of "+p.Name+"/"+c.Name, err)
					continue
				}
				g.write(name, out)
			}
		}
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		page, err := podhttp.Get(ctx, g.cfg, p.Namespace, p.Name, containerPort(p, portName, port), "/metrics")
		var status *podhttp.StatusError
		if err != nil && !errors.As(err, &status) {
			g.note("metrics of "+p.Name, err)
			continue
		}
		g.write(fmt.Sprintf("%s/%s/metrics.txt", what, p.Name), page)
	}
}
