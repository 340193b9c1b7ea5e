package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aboutv1alpha1 "github.com/flotilla-io/flotilla/api/about/v1alpha1"
	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/fabric/fabricapi"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/internal/podhttp"
	"github.com/flotilla-io/flotilla/internal/version"
	"github.com/flotilla-io/flotilla/offload/placement"
	"github.com/flotilla-io/flotilla/peering/protocol"
)

func init() { register(newInfoCommand) }

// The install's objects info reads, as deploy/ names them.
const (
	clustersetDNS = "flotilla-clusterset-dns"
	// fencesCheck is the agent's readiness check that proves its
	// admission policies in force.
	fencesCheck = "fences"
)

// installInfo is this cluster's install at a glance, as info prints it.
type installInfo struct {
	Cluster       clusterInfo  `json:"cluster"`
	Client        version.Info `json:"client"`
	Agent         agentInfo    `json:"agent"`
	Fences        fencesInfo   `json:"fences"`
	Fabric        fabricInfo   `json:"fabric"`
	Webhook       webhookInfo  `json:"webhook"`
	ClustersetDNS dnsInfo      `json:"clustersetDNS"`
	Peers         peersInfo    `json:"peers"`
	// Notes say what could not be read, and why.
	Notes []string `json:"notes,omitempty"`
}

type clusterInfo struct {
	Context    string `json:"context,omitempty"`
	Server     string `json:"server"`
	ID         string `json:"id,omitempty"`
	ClusterSet string `json:"clusterSet,omitempty"`
}

type agentInfo struct {
	// Installed: its Deployment is there; absent: it is known not to be
	// (not merely unreadable).
	Installed  bool `json:"installed"`
	absent     bool
	Deployment string     `json:"deployment"`
	Replicas   int32      `json:"replicas"`
	Ready      int32      `json:"ready"`
	Pods       []agentPod `json:"pods,omitempty"`
	// Gateway is which replica runs the data path.
	Gateway gatewayInfo `json:"gateway"`
}

type agentPod struct {
	Name    string `json:"name"`
	Node    string `json:"node,omitempty"`
	Ready   bool   `json:"ready"`
	Version string `json:"version,omitempty"`
	Commit  string `json:"commit,omitempty"`
	// Checks are the agent's readiness checks, as its /readyz?verbose
	// lists them.
	Checks []check `json:"checks,omitempty"`
}

type check struct {
	Name    string `json:"name"`
	OK      bool   `json:"ok"`
	Message string `json:"message,omitempty"`
}

// fencesInfo: whether the agent has proven its admission policies in
// force (it grants nothing until it has); Known is false when no agent
// could say.
type fencesInfo struct {
	Known    bool   `json:"known"`
	Enforced bool   `json:"enforced"`
	Message  string `json:"message,omitempty"`
}

type fabricInfo struct {
	Installed bool        `json:"installed"`
	DaemonSet string      `json:"daemonSet"`
	Desired   int32       `json:"desired"`
	Ready     int32       `json:"ready"`
	Nodes     []fabricPod `json:"nodes,omitempty"`
}

type fabricPod struct {
	Node  string `json:"node"`
	Pod   string `json:"pod"`
	Ready bool   `json:"ready"`
}

type webhookInfo struct {
	Installed     bool   `json:"installed"`
	Name          string `json:"name"`
	URL           string `json:"url,omitempty"`
	CABundle      bool   `json:"caBundle"`
	FailurePolicy string `json:"failurePolicy,omitempty"`
}

type dnsInfo struct {
	Installed bool   `json:"installed"`
	Service   string `json:"service"`
	ClusterIP string `json:"clusterIP,omitempty"`
	// Endpoints is how many of the Service's endpoints are ready: 0,
	// and the zone does not answer.
	Endpoints int `json:"readyEndpoints"`
}

type peersInfo struct {
	Total  int            `json:"total"`
	Phases map[string]int `json:"phases,omitempty"`
}

func newInfoCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "info",
		GroupID: groupDiagnose,
		Short:   "this cluster's install at a glance: agent and fabric readiness, the active gateway, fences, webhook, clusterset DNS, peers",
		Long: `This cluster's install at a glance: the agent's version and readiness
(each of its checks), which replica runs the data path (its node, since
when it holds the Lease flotilla-agent and how often that changed hands),
whether its admission policies are proven in force
(fences: nothing is granted until they are), the fabric's readiness on
each node, the placement webhook, the clusterset DNS Service and the
peers by phase. The agent's checks and version are read from its pod
through the API server's port-forward, with your rights; what cannot be
read is noted, not fatal.`,
		Args: noArgs,
	}
	cluster := clusterFlags(cmd)
	namespace := cmd.Flags().String("namespace", agentNamespace, "the agent's namespace")
	o := outputFlag(cmd, objectFormats...)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		format, err := parseOutput(*o, objectFormats...)
		if err != nil {
			return err
		}
		cfg, context, err := cluster.restConfig()
		if err != nil {
			return err
		}
		info, err := readInstall(cmd.Context(), cfg, *namespace)
		if err != nil {
			return err
		}
		info.Cluster.Context = context
		if format != outputTable {
			err = writeJSONOrYAML(cmd.OutOrStdout(), info, format)
		} else {
			err = writeInfo(cmd.OutOrStdout(), info)
		}
		if err == nil && info.Agent.absent {
			err = fmt.Errorf("Flotilla is not installed in %s: no Deployment %s (docs/install.md)", *namespace, info.Agent.Deployment)
		}
		return err
	}
	return cmd
}

// readInstall reads the install in namespace ns. Only a cluster that
// cannot be reached at all is an error; what cannot be read is a note.
func readInstall(ctx context.Context, cfg *rest.Config, ns string) (installInfo, error) {
	info := installInfo{
		Cluster:       clusterInfo{Server: cfg.Host},
		Client:        protocol.Build(),
		Agent:         agentInfo{Deployment: ns + "/" + agentDeployment},
		Fabric:        fabricInfo{DaemonSet: ns + "/" + fabricapi.DaemonSetName},
		Webhook:       webhookInfo{Name: placement.ConfigurationName},
		ClustersetDNS: dnsInfo{Service: ns + "/" + clustersetDNS},
	}
	kube, err := kubeclient.NewForConfig(cfg)
	if err != nil {
		return info, err
	}
	c, err := graphClient(cfg)
	if err != nil {
		return info, err
	}
	note := func(what string, err error) {
		info.Notes = append(info.Notes, fmt.Sprintf("%s: %v", what, err))
	}
	// The first read says whether the cluster answers at all.
	deploy, err := kube.AppsV1().Deployments(ns).Get(ctx, agentDeployment, metav1.GetOptions{})
	switch {
	case err == nil:
		readAgent(ctx, cfg, kube, deploy, &info, note)
	case apierrors.IsNotFound(err):
		info.Agent.absent = true
	case apierrors.IsForbidden(err):
		note("the agent's Deployment", err)
	default:
		return info, apiError("get", "", err)
	}
	readClusterProperties(ctx, c, &info, note)
	readFabric(ctx, kube, ns, &info, note)
	readWebhook(ctx, kube, &info, note)
	readDNS(ctx, kube, ns, &info, note)
	var peers v1alpha1.PeerList
	if err := c.List(ctx, &peers); err != nil {
		if !absent(err) {
			note("peers", err)
		}
	} else {
		info.Peers.Total = len(peers.Items)
		for _, p := range peers.Items {
			if info.Peers.Phases == nil {
				info.Peers.Phases = map[string]int{}
			}
			info.Peers.Phases[orDash(string(p.Status.Phase))]++
		}
	}
	return info, nil
}

func readClusterProperties(ctx context.Context, c client.Client, info *installInfo, note func(string, error)) {
	for name, to := range map[string]*string{aboutv1alpha1.ClusterIDProperty: &info.Cluster.ID, aboutv1alpha1.ClusterSetProperty: &info.Cluster.ClusterSet} {
		var p aboutv1alpha1.ClusterProperty
		switch err := c.Get(ctx, client.ObjectKey{Name: name}, &p); {
		case err == nil:
			*to = p.Spec.Value
		case !absent(err):
			note("ClusterProperty "+name, err)
		}
	}
}

// readAgent reads the agent's pods and, from each running one, its
// version and readiness checks.
func readAgent(ctx context.Context, cfg *rest.Config, kube kubeclient.Interface, d *appsv1.Deployment, info *installInfo, note func(string, error)) {
	a := &info.Agent
	a.Installed, a.Ready = true, d.Status.ReadyReplicas
	a.Replicas = 1
	if d.Spec.Replicas != nil {
		a.Replicas = *d.Spec.Replicas
	}
	pods, err := podsOf(ctx, kube, d.Namespace, d.Spec.Selector)
	if err != nil {
		note("the agent's pods", err)
		return
	}
	// Each running pod is read through a port-forward of its own, all
	// at once: on a loaded cluster a forward takes seconds to be ready.
	a.Pods = make([]agentPod, len(pods))
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		a.Pods[i] = agentPod{Name: p.Name, Node: p.Spec.NodeName, Ready: podReady(p)}
		if p.Status.Phase == corev1.PodRunning {
			wg.Go(func() { errs[i] = readAgentPort(ctx, cfg, p, containerPort(p, metricsPort, 9470), &a.Pods[i]) })
		}
	}
	wg.Wait()
	for i, ap := range a.Pods {
		if errs[i] != nil {
			note("agent pod "+ap.Name, errs[i])
		}
		if c, ok := findCheck(ap.Checks, fencesCheck); ok {
			info.Fences = fencesInfo{Known: true, Enforced: c.OK, Message: c.Message}
		}
	}
	readGateway(ctx, kube, d.Namespace, pods, info, note)
}

// readAgentPort reads the agent's version from /metrics and its checks
// from /readyz?verbose.
func readAgentPort(ctx context.Context, cfg *rest.Config, p corev1.Pod, port int, ap *agentPod) error {
	f, err := podhttp.Open(ctx, cfg, p.Namespace, p.Name, port)
	if err != nil {
		return err
	}
	defer f.Close()
	page, err := f.Get(ctx, "/readyz?verbose")
	var status *podhttp.StatusError
	if err != nil && !errors.As(err, &status) {
		return err
	}
	ap.Checks = parseReadyz(page)
	metrics, err := f.Get(ctx, "/metrics")
	if err != nil {
		return err
	}
	ap.Version, ap.Commit = buildOf(metrics)
	return nil
}

// parseReadyz reads the lines "[+]name ok" and "[-]name failed: why" of
// a /readyz?verbose answer.
func parseReadyz(page []byte) []check {
	var out []check
	for _, line := range strings.Split(string(page), "\n") {
		switch {
		case strings.HasPrefix(line, "[+]"):
			out = append(out, check{Name: strings.TrimSuffix(line[3:], " ok"), OK: true})
		case strings.HasPrefix(line, "[-]"):
			name, why, _ := strings.Cut(line[3:], " failed: ")
			out = append(out, check{Name: strings.TrimSuffix(name, " failed"), Message: why})
		}
	}
	return out
}

func findCheck(cs []check, name string) (check, bool) {
	for _, c := range cs {
		if c.Name == name {
			return c, true
		}
	}
	return check{}, false
}

// buildOf reads the version and commit of flotilla_build_info.
func buildOf(metrics []byte) (version, commit string) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(metrics))
	if err != nil {
		return "", ""
	}
	f, ok := families["flotilla_build_info"]
	if !ok || len(f.GetMetric()) == 0 {
		return "", ""
	}
	for _, l := range f.GetMetric()[0].GetLabel() {
		switch l.GetName() {
		case "version":
			version = l.GetValue()
		case "commit":
			commit = l.GetValue()
		}
	}
	return version, commit
}

func readFabric(ctx context.Context, kube kubeclient.Interface, ns string, info *installInfo, note func(string, error)) {
	ds, err := kube.AppsV1().DaemonSets(ns).Get(ctx, fabricapi.DaemonSetName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return
	case err != nil:
		note("the fabric's DaemonSet", err)
		return
	}
	f := &info.Fabric
	f.Installed, f.Desired, f.Ready = true, ds.Status.DesiredNumberScheduled, ds.Status.NumberReady
	pods, err := podsOf(ctx, kube, ns, ds.Spec.Selector)
	if err != nil {
		note("the fabric's pods", err)
		return
	}
	for _, p := range pods {
		f.Nodes = append(f.Nodes, fabricPod{Node: p.Spec.NodeName, Pod: p.Name, Ready: podReady(p)})
	}
	sort.Slice(f.Nodes, func(i, j int) bool { return f.Nodes[i].Node < f.Nodes[j].Node })
}

func readWebhook(ctx context.Context, kube kubeclient.Interface, info *installInfo, note func(string, error)) {
	mw, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, placement.ConfigurationName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return
	case err != nil:
		note("the placement webhook", err)
		return
	}
	w := &info.Webhook
	w.Installed = true
	for _, h := range mw.Webhooks {
		if h.Name != placement.WebhookName {
			continue
		}
		if h.ClientConfig.URL != nil {
			w.URL = *h.ClientConfig.URL
		}
		w.CABundle = len(h.ClientConfig.CABundle) > 0
		if h.FailurePolicy != nil {
			w.FailurePolicy = string(*h.FailurePolicy)
		}
	}
}

func readDNS(ctx context.Context, kube kubeclient.Interface, ns string, info *installInfo, note func(string, error)) {
	svc, err := kube.CoreV1().Services(ns).Get(ctx, clustersetDNS, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return
	case err != nil:
		note("the clusterset DNS Service", err)
		return
	}
	d := &info.ClustersetDNS
	d.Installed, d.ClusterIP = true, svc.Spec.ClusterIP
	endpoints, err := kube.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + clustersetDNS})
	if err != nil {
		note("the clusterset DNS Service's endpoints", err)
		return
	}
	for _, s := range endpoints.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				d.Endpoints++
			}
		}
	}
}

// writeInfo prints the install as a person reads it: one line per part,
// what is wrong first on it.
func writeInfo(w io.Writer, info installInfo) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	line := func(part, format string, a ...any) { fmt.Fprintf(tw, "%s\t%s\n", part, fmt.Sprintf(format, a...)) }
	c := info.Cluster
	line("Cluster", "%s%s%s", orDash(c.Context)+" ("+c.Server+")", ifSet(", ID ", c.ID), ifSet(", clusterset ", c.ClusterSet))
	line("Client", "flotilla %s (commit %s)", info.Client.Version, info.Client.Commit)
	a := info.Agent
	switch {
	case a.absent:
		line("Agent", "not installed (no Deployment %s)", a.Deployment)
	case !a.Installed:
		line("Agent", "unknown (see below)")
	default:
		line("Agent", "%s: %d/%d ready", a.Deployment, a.Ready, a.Replicas)
	}
	for _, p := range a.Pods {
		line("", "pod %s on %s: %s%s", p.Name, orDash(p.Node), readiness(p.Ready), ifSet(", version ", p.Version)+ifSet(" (commit ", p.Commit)+closeIf(p.Commit))
		if len(p.Checks) > 0 {
			line("", "checks: %s", describeChecks(p.Checks))
		}
	}
	if a.Installed {
		line("Gateway", "%s", describeGateway(a.Gateway, time.Now()))
	}
	f := info.Fences
	switch {
	case !f.Known:
		line("Fences", "unknown: no agent said (nothing is granted until it proves them)")
	case f.Enforced:
		line("Fences", "enforced: the admission policies confining the agent and its consumers are proven in force")
	default:
		line("Fences", "NOT enforced: %s (nothing is granted until they are)", f.Message)
	}
	fb := info.Fabric
	if !fb.Installed {
		line("Fabric", "none (no DaemonSet %s: only the gateway node's pods reach peers)", fb.DaemonSet)
	} else {
		line("Fabric", "%s: %d/%d nodes ready", fb.DaemonSet, fb.Ready, fb.Desired)
		for _, n := range fb.Nodes {
			line("", "node %s: pod %s %s", orDash(n.Node), n.Pod, readiness(n.Ready))
		}
	}
	wh := info.Webhook
	if !wh.Installed {
		line("Webhook", "none (MutatingWebhookConfiguration %s: the agent makes it once it serves the webhook)", wh.Name)
	} else {
		ca := "no CA bundle"
		if wh.CABundle {
			ca = "CA bundle set"
		}
		line("Webhook", "%s: %s, %s, failure policy %s", wh.Name, orDash(wh.URL), ca, orDash(wh.FailurePolicy))
	}
	d := info.ClustersetDNS
	if !d.Installed {
		line("Clusterset DNS", "none (no Service %s)", d.Service)
	} else {
		line("Clusterset DNS", "Service %s at %s:53, %d endpoint(s) ready", d.Service, orDash(d.ClusterIP), d.Endpoints)
	}
	line("Peers", "%s", describePeers(info.Peers))
	for _, n := range info.Notes {
		line("Not read", "%s", n)
	}
	return tw.Flush()
}

func readiness(ready bool) string {
	if ready {
		return "Ready"
	}
	return "not Ready"
}

func ifSet(prefix, v string) string {
	if v == "" {
		return ""
	}
	return prefix + v
}

func closeIf(v string) string {
	if v == "" {
		return ""
	}
	return ")"
}

// describeChecks lists the failing checks with their reasons, then how
// many pass.
func describeChecks(cs []check) string {
	var failing []string
	for _, c := range cs {
		if !c.OK {
			failing = append(failing, c.Name+" failed: "+c.Message)
		}
	}
	passing := fmt.Sprintf("%d of %d pass", len(cs)-len(failing), len(cs))
	if len(failing) == 0 {
		return passing
	}
	return strings.Join(failing, "; ") + "; " + passing
}

func describePeers(p peersInfo) string {
	if p.Total == 0 {
		return "none yet"
	}
	phases := make([]string, 0, len(p.Phases))
	for phase, n := range p.Phases {
		phases = append(phases, fmt.Sprintf("%d %s", n, phase))
	}
	sort.Strings(phases)
	return fmt.Sprintf("%d: %s", p.Total, strings.Join(phases, ", "))
}
