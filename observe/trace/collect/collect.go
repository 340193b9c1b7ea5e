// Package collect gathers one cluster's side of a trace: its Peers, the
// fabric's plan (nodes, their addresses and pod blocks, the gateway), the
// pods a trace names, and the kernel state its agent and fabric pods
// serve at /trace, read through the API server's pod proxy as flotilla
// graph reads the agent's metrics. What cannot be read is noted in the
// cluster's Unread, and the trace says which step it leaves unknown.
package collect

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aboutv1alpha1 "github.com/flotilla-io/flotilla/api/about/v1alpha1"
	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/fabric/fabricapi"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/internal/podhttp"
	"github.com/flotilla-io/flotilla/observe/trace"
)

// The agent as deploy/ installs it.
const (
	Namespace     = "flotilla-system"
	agentSelector = "app.kubernetes.io/name=flotilla,app.kubernetes.io/component=agent"
	fabricLabel   = "app.kubernetes.io/component=fabric"
	agentPort     = 9470
	// parallel bounds the fabric pods asked at once.
	parallel = 8
)

// Source is one cluster to read.
type Source struct {
	// Name calls the cluster in messages until its Peers' names are
	// known (a kubeconfig context, say).
	Name   string
	Config *rest.Config
	// Report, when set, fetches the /trace report of a node's fabric pod
	// (node "" : the agent's) instead of a port-forward: tests reach an
	// agent that runs as a process.
	Report func(ctx context.Context, node string) (trace.NodeReport, error)
}

// Ends are what a trace names: pods by name (namespace/name or name) and
// addresses, whose pods are looked up.
type Ends struct {
	Names []string
	Addrs []netip.Addr
}

// Collect reads the cluster. Only the Peers are required; the rest is
// noted in Unread when it cannot be read.
func Collect(ctx context.Context, s Source, ends Ends) (*trace.Cluster, error) {
	where := s.Config.Host
	sch := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{v1alpha1.AddToScheme, aboutv1alpha1.AddToScheme} {
		if err := add(sch); err != nil {
			return nil, err
		}
	}
	c, err := client.New(s.Config, client.Options{Scheme: sch})
	if err != nil {
		return nil, fmt.Errorf("%s: client: %w", where, err)
	}
	kube, err := kubeclient.NewForConfig(s.Config)
	if err != nil {
		return nil, fmt.Errorf("%s: client: %w", where, err)
	}
	out := &trace.Cluster{Name: s.Name, Unread: map[string]string{}}
	var peers v1alpha1.PeerList
	if err := c.List(ctx, &peers); err != nil {
		if meta.IsNoMatchError(err) {
			return nil, fmt.Errorf("%s: no Peers there: Flotilla is not installed (docs/install.md)", where)
		}
		return nil, fmt.Errorf("%s: list Peers: %w", where, err)
	}
	for i := range peers.Items {
		out.Peers = append(out.Peers, PeerOf(&peers.Items[i]))
	}
	var id aboutv1alpha1.ClusterProperty
	if err := c.Get(ctx, client.ObjectKey{Name: "cluster.clusterset.k8s.io"}, &id); err == nil {
		out.ID = id.Spec.Value
	} else {
		out.Unread["id"] = err.Error()
	}
	r := reader{kube: kube, cfg: s.Config, report: s.Report}
	plan, planErr := readPlan(ctx, kube)
	if planErr != nil {
		out.Unread["plan"] = planErr.Error()
	}
	agentRep, agentErr := r.agent(ctx)
	if agentErr != nil {
		out.Unread["agent"] = agentErr.Error()
	} else if len(agentRep.Errors) > 0 {
		out.Unread["agent"] = strings.Join(agentRep.Errors, "; ")
	}
	out.Tunnel = agentRep.Tunnel
	if planErr == nil {
		out.Gateway = plan.GatewayNode
		for _, n := range plan.Nodes {
			out.Nodes = append(out.Nodes, trace.Node{Name: n.Name, Addr: n.Addr, PodBlocks: n.PodCIDRs})
		}
		r.nodes(ctx, out, plan.GatewayNode)
	}
	// The gateway's kernel is the agent's (the same host network).
	gw := out.Gateway
	if gw == "" {
		gw = agentRep.Node
	}
	if gw == "" {
		gw = "gateway"
	}
	found := false
	for i := range out.Nodes {
		if out.Nodes[i].Name == gw {
			out.Nodes[i].Kernel, found = agentRep.Kernel, true
		}
	}
	if !found {
		out.Nodes = append(out.Nodes, trace.Node{Name: gw, Kernel: agentRep.Kernel})
	}
	pods, err := findPods(ctx, kube, ends)
	if err != nil {
		out.Unread["pods"] = err.Error()
	}
	out.Pods = pods
	return out, nil
}

// PeerOf is a Peer in a trace's terms; a condition that holds the
// peering up explains its phase.
func PeerOf(p *v1alpha1.Peer) trace.Peer {
	s := p.Status
	out := trace.Peer{
		ID: p.Name, Name: s.ClusterName, Networking: string(p.Spec.Networking), Phase: string(s.Phase),
		Traffic: string(s.Traffic), PublicKey: s.PublicKey, Endpoint: s.Endpoint,
		Theirs: views(s.TheirNetworks), Mine: views(s.MyNetworks),
	}
	if s.LastHandshake != nil {
		t := s.LastHandshake.Time
		out.LastHandshake = &t
	}
	for _, kind := range []string{v1alpha1.ConditionAccepted, v1alpha1.ConditionViewsAgreed, v1alpha1.ConditionTunnelUp} {
		if c := meta.FindStatusCondition(s.Conditions, kind); c != nil && c.Status != metav1.ConditionTrue {
			out.Reason, out.Message = c.Reason, c.Message
			break
		}
	}
	return out
}

// views converts; a view another cluster wrote that does not parse is
// left out (the Peer's phase says the views are not agreed).
func views(ns []v1alpha1.NetworkView) []trace.View {
	var out []trace.View
	for _, n := range ns {
		r, err1 := netip.ParsePrefix(n.Range)
		a, err2 := netip.ParsePrefix(n.As)
		if err1 == nil && err2 == nil {
			out = append(out, trace.View{Real: r, As: a})
		}
	}
	return out
}

func readPlan(ctx context.Context, kube kubeclient.Interface) (fabricapi.Plan, error) {
	cm, err := kube.CoreV1().ConfigMaps(Namespace).Get(ctx, fabricapi.PlanName, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return fabricapi.Plan{}, fmt.Errorf("no fabric plan (ConfigMap %s/%s): the agent runs without the fabric, every pod counts as the gateway's", Namespace, fabricapi.PlanName)
		}
		return fabricapi.Plan{}, fmt.Errorf("read the fabric plan: %w", err)
	}
	return fabricapi.ParsePlan([]byte(cm.Data[fabricapi.PlanKey]))
}

// findPods looks up the pods the trace names, by name and by address.
func findPods(ctx context.Context, kube kubeclient.Interface, ends Ends) ([]trace.Pod, error) {
	var out []trace.Pod
	seen := map[string]bool{}
	add := func(ps []corev1.Pod) {
		for _, p := range ps {
			ip, err := netip.ParseAddr(p.Status.PodIP)
			if err != nil || p.Spec.HostNetwork || seen[p.Namespace+"/"+p.Name] {
				continue
			}
			seen[p.Namespace+"/"+p.Name] = true
			out = append(out, trace.Pod{Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName, IP: ip})
		}
	}
	var selectors []string
	for _, n := range ends.Names {
		ns, name, ok := strings.Cut(n, "/")
		if ok {
			p, err := kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				add([]corev1.Pod{*p})
			} else if !apierrors.IsNotFound(err) {
				return out, fmt.Errorf("read pod %s: %w", n, err)
			}
			continue
		}
		selectors = append(selectors, "metadata.name="+n)
	}
	for _, a := range ends.Addrs {
		selectors = append(selectors, "status.podIP="+a.String())
	}
	for _, sel := range selectors {
		list, err := kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return out, fmt.Errorf("list pods %s: %w", sel, err)
		}
		add(list.Items)
	}
	return out, nil
}

// reader fetches /trace reports.
type reader struct {
	kube   kubeclient.Interface
	cfg    *rest.Config
	report func(ctx context.Context, node string) (trace.NodeReport, error)
}

func (r reader) agent(ctx context.Context) (trace.NodeReport, error) {
	if r.report != nil {
		return r.report(ctx, "")
	}
	pods, err := r.kube.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: agentSelector})
	if err != nil {
		return trace.NodeReport{}, fmt.Errorf("find the agent: %w", err)
	}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		port := agentPort
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == "metrics" {
					port = int(cp.ContainerPort)
				}
			}
		}
		rep, err := r.proxy(ctx, p, port)
		if err == nil && rep.Node == "" {
			rep.Node = p.Spec.NodeName
		}
		return rep, err
	}
	return trace.NodeReport{}, fmt.Errorf("no running agent pod in %s (%s)", Namespace, agentSelector)
}

// nodes reads every worker's report from its fabric pod, a few at a time.
func (r reader) nodes(ctx context.Context, c *trace.Cluster, gateway string) {
	var mu sync.Mutex
	note := func(node, why string) {
		mu.Lock()
		c.Unread["node/"+node] = why
		mu.Unlock()
	}
	fabric := map[string]corev1.Pod{}
	if r.report == nil {
		pods, err := r.kube.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: fabricLabel})
		if err != nil {
			for _, n := range c.Nodes {
				note(n.Name, fmt.Sprintf("list the fabric's pods: %v", err))
			}
			return
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				fabric[p.Spec.NodeName] = p
			}
		}
	}
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range c.Nodes {
		n := &c.Nodes[i]
		if n.Name == gateway {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var rep trace.NodeReport
			var err error
			if r.report != nil {
				rep, err = r.report(ctx, n.Name)
			} else if p, ok := fabric[n.Name]; ok {
				rep, err = r.proxy(ctx, p, fabricapi.MetricsPort)
			} else {
				err = fmt.Errorf("no running fabric pod on node %s", n.Name)
			}
			switch {
			case err != nil:
				note(n.Name, err.Error())
			case len(rep.Errors) > 0:
				note(n.Name, strings.Join(rep.Errors, "; "))
			}
			n.Kernel = rep.Kernel
		}()
	}
	wg.Wait()
}

func (r reader) proxy(ctx context.Context, p corev1.Pod, port int) (trace.NodeReport, error) {
	// Through a port-forward, which the API server authorizes with the
	// caller's rights: the pod serves /trace to its loopback without a
	// token.
	b, err := podhttp.Get(ctx, r.cfg, p.Namespace, p.Name, port, trace.ReportPath)
	if err != nil {
		return trace.NodeReport{}, err
	}
	rep, err := trace.ParseNodeReport(b)
	if err != nil {
		return trace.NodeReport{}, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return rep, nil
}
