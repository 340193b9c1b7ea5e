package vnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	apiversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/remote"
)

// How a virtual node keeps its heartbeat (docs/offload.md, "Virtual
// nodes"): the kubelet's numbers. The node lifecycle controller counts a
// node alive while either its Lease is renewed or its Ready condition's
// heartbeat moves within --node-monitor-grace-period (50 s by default).
const (
	virtualNodeLeaseRenew    = 10 * time.Second
	virtualNodeLeaseDuration = 40 * time.Second
	virtualNodeHeartbeat     = 40 * time.Second
	// FieldManager is the field manager of every write to a
	// virtual node and its Lease.
	FieldManager = "flotilla-virtual-node"
)

// Config is what Nodes needs.
type Config struct {
	// Config reaches the local API server (Peers, Nodes).
	Config *rest.Config
	// Client writes Nodes and Leases; one made from Config when nil.
	Client kubeclient.Interface
	// Credentials say what each provider granted: the virtual node's
	// capacity is the grant's limits.
	Credentials remote.Credentials
	// Address is the virtual nodes' InternalIP: where this cluster's API
	// server reaches the agent's kubelet API.
	Address netip.Addr
	// KubeletPort is where the agent serves the kubelet API
	// (status.daemonEndpoints.kubeletEndpoint.Port).
	KubeletPort int32
	// Peers, when set, is where Peers are read and watched, shared with
	// the agent's other components (PeerCache); a cache of its own when
	// nil.
	Peers offload.PeerCache

	Logger  *slog.Logger
	Metrics prometheus.Registerer
}

// Nodes keeps one Node in this cluster for each provider that
// granted it offloading: named VirtualNodeName(provider), labelled and
// tainted as a virtual node, its capacity the grant's limits, Ready only
// while the peering is Connected and the credential works, with a Lease
// in kube-node-lease renewed like a kubelet's. It removes the Node when
// the grant is revoked, or the Peer goes. It writes only Nodes
// and Leases it labelled as its own, and never a whole Node: the node
// lifecycle controller writes taints and conditions on them too.
// Level-triggered: one reconcile per provider, from its Peer and its Node.
type Nodes struct {
	cfg   Config
	log   *slog.Logger
	cache cache.Cache // Peers, and our Nodes only
	ctrl  *ctrl.Controller[string]
	queue ctrl.Queue[string]
	m     *virtualNodeMetrics
	// kubeletVersion is what the nodes report, set before the first
	// reconcile.
	kubeletVersion string

	mu sync.Mutex
	// leases are the Leases last written, by provider: renewing one
	// needs no read.
	leases map[string]*coordinationv1.Lease
	ready  map[string]bool
}

// virtualNodeWorkers reconcile different providers at once.
const virtualNodeWorkers = 2

// NewNodes checks cfg and prepares Nodes; Run starts them.
func NewNodes(cfg Config) (*Nodes, error) {
	if cfg.Config == nil || cfg.Credentials == nil {
		return nil, errors.New("virtual nodes: the local REST config and the credentials are required")
	}
	if !cfg.Address.IsValid() {
		return nil, errors.New("virtual nodes: the agent's address (the nodes' InternalIP) is required")
	}
	if cfg.KubeletPort <= 0 || cfg.KubeletPort > 65535 {
		return nil, fmt.Errorf("virtual nodes: kubelet port %d: want 1-65535, where the agent serves the kubelet API", cfg.KubeletPort)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Client == nil {
		c, err := kubeclient.NewForConfig(cfg.Config)
		if err != nil {
			return nil, fmt.Errorf("virtual nodes: client: %w", err)
		}
		cfg.Client = c
	}
	scheme := runtime.NewScheme()
	if err := errors.Join(v1alpha1.AddToScheme(scheme), corev1.AddToScheme(scheme)); err != nil {
		return nil, fmt.Errorf("virtual nodes: scheme: %w", err)
	}
	ca, err := cache.New(cfg.Config, cache.Options{
		Scheme: scheme, Mapper: virtualNodeMapper(), DefaultTransform: cache.TransformStripManagedFields(),
		// Our Nodes only: a Node without both labels is not ours, even
		// under our name.
		ByObject: map[client.Object]cache.ByObject{&corev1.Node{}: {Label: ourVirtualNodes()}},
	})
	if err != nil {
		return nil, fmt.Errorf("virtual nodes: cache: %w", err)
	}
	m, err := newVirtualNodeMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("virtual nodes: metrics: %w", err)
	}
	v := &Nodes{
		cfg: cfg, log: cfg.Logger.With("component", "virtual-nodes"), cache: offload.WithPeers(ca, cfg.Peers),
		m:      m,
		leases: map[string]*coordinationv1.Lease{}, ready: map[string]bool{},
	}
	v.ctrl, err = ctrl.New(ctrl.Config[string]{
		Name: "virtual_nodes", Workers: virtualNodeWorkers, Reconcile: v.reconcile, Metrics: cfg.Metrics,
		Errors: &ctrl.ErrorLog[string]{
			Logger: v.log, Failed: "virtual node not reconciled; retrying", Recovered: "virtual node reconciled again",
			Attrs: func(id string) []any { return []any{"peer", id, "node", offload.VirtualNodeName(id)} },
			// Someone wrote the Node between our read and our write (the
			// controller manager often does, just after we create one):
			// the retry reads it again.
			Level: func(err error) slog.Level {
				if apierrors.IsConflict(err) {
					return slog.LevelDebug
				}
				return slog.LevelWarn
			},
		},
		Failed: func(id string, err error) { v.m.errors.WithLabelValues(id, errorReason(err)).Inc() },
	})
	if err != nil {
		return nil, fmt.Errorf("virtual nodes: %w", err)
	}
	v.queue = v.ctrl.Queue()
	return v, nil
}

// virtualNodeMapper knows where Peers and Nodes are served, without
// asking.
func virtualNodeMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{v1alpha1.GroupVersion, corev1.SchemeGroupVersion})
	m.Add(v1alpha1.GroupVersion.WithKind("Peer"), meta.RESTScopeRoot)
	m.Add(corev1.SchemeGroupVersion.WithKind("Node"), meta.RESTScopeRoot)
	return m
}

// ourVirtualNodes selects the Nodes this agent made.
func ourVirtualNodes() labels.Selector {
	virtual, _ := labels.NewRequirement(offload.LabelVirtualNode, selection.Equals, []string{"true"})
	managed, _ := labels.NewRequirement(v1alpha1.LabelManagedBy, selection.Equals, []string{v1alpha1.ManagedByValue})
	return labels.NewSelector().Add(*virtual, *managed)
}

// isOurVirtualNode reports whether obj carries the labels of what this
// agent made: the only Nodes and Leases it ever writes or deletes.
func isOurVirtualNode(obj interface{ GetLabels() map[string]string }) bool {
	l := obj.GetLabels()
	return l[offload.LabelVirtualNode] == "true" && l[v1alpha1.LabelManagedBy] == v1alpha1.ManagedByValue
}

// Ready reports whether provider's virtual node exists and this agent
// last said it is Ready: offloaded pods are reachable there.
func (v *Nodes) Ready(provider string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.ready[provider]
}

// Run watches Peers and the virtual nodes and reconciles until ctx ends;
// it returns once every goroutine it started has.
func (v *Nodes) Run(ctx context.Context) error {
	// A Node whose Peer is not read yet would look unwanted and be deleted.
	return v.ctrl.RunWithCache(ctx, ctrl.Start{
		What: "virtual nodes", Cache: v.cache,
		Watches: []ctrl.Watch{
			ctrl.On(&v1alpha1.Peer{}, v.events(func(obj any) string { return obj.(*v1alpha1.Peer).Name })),
			ctrl.On(&corev1.Node{}, v.events(func(obj any) string { return obj.(*corev1.Node).Labels[offload.LabelClusterID] })),
		},
		Synced: func(context.Context, *sync.WaitGroup) error {
			server, err := v.cfg.Client.Discovery().ServerVersion()
			if err != nil {
				v.log.Warn("the API server's version is unknown; virtual nodes report the release the agent is built with", "err", err)
				server = &apiversion.Info{}
			}
			v.kubeletVersion = virtualNodeKubeletVersion(server.GitVersion)
			v.log.Info("keeping a virtual node for each provider that granted offloading",
				"address", v.cfg.Address, "kubeletPort", v.cfg.KubeletPort, "version", v.kubeletVersion)
			return nil
		},
	})
}

// events queue the provider an object is about. Every change counts: a
// reconcile that finds its Node as wanted writes nothing.
func (v *Nodes) events(key func(any) string) toolscache.ResourceEventHandler {
	return ctrl.OnEvery(func(obj any) {
		switch obj.(type) {
		case *v1alpha1.Peer, *corev1.Node:
		default:
			return
		}
		if id := key(obj); identity.ValidateClusterID(id) == nil {
			v.queue.Add(id)
		}
	})
}

// reconcile brings provider id's virtual node, and its Lease, in line with
// its Peer; it returns when to look again (the next renewal or heartbeat).
func (v *Nodes) reconcile(ctx context.Context, id string) (time.Duration, error) {
	var peer *v1alpha1.Peer
	var p v1alpha1.Peer
	switch err := v.cache.Get(ctx, client.ObjectKey{Name: id}, &p); {
	case err == nil:
		peer = &p
	case !apierrors.IsNotFound(err):
		return 0, fmt.Errorf("read Peer %s: %w", id, err)
	}
	var node *corev1.Node
	var n corev1.Node
	switch err := v.cache.Get(ctx, client.ObjectKey{Name: offload.VirtualNodeName(id)}, &n); {
	case err == nil:
		node = &n
	case !apierrors.IsNotFound(err):
		return 0, fmt.Errorf("read node %s: %w", offload.VirtualNodeName(id), err)
	}
	if ok, why := virtualNodeWanted(peer); !ok {
		return 0, v.remove(ctx, id, node, why)
	}
	now := time.Now()
	want := v.desiredNode(peer, node, now)
	var err error
	if node == nil {
		node, err = v.createNode(ctx, want)
	}
	if err == nil {
		node, err = v.patchNode(ctx, want, node, now)
	}
	if errors.Is(err, errForeignNode) {
		v.setReady(id, true, false)
	}
	if err != nil {
		return 0, err
	}
	v.setReady(id, true, want.ready)
	renewIn, err := v.renewLease(ctx, id, node, now)
	if err != nil {
		return 0, err
	}
	beat := virtualNodeHeartbeat
	if c := nodeCondition(node, corev1.NodeReady); c != nil {
		beat = c.LastHeartbeatTime.Add(virtualNodeHeartbeat).Sub(now)
	}
	return max(min(renewIn, beat), time.Second), nil
}

// remove deletes provider id's virtual node (node, ours, nil: none) and
// its Lease.
func (v *Nodes) remove(ctx context.Context, id string, node *corev1.Node, why string) error {
	if node != nil {
		// The UID: a Node that replaced ours since it was read is not ours
		// to delete.
		err := v.cfg.Client.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &node.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete virtual node %s (%s): %w", node.Name, why, err)
		}
		v.m.writes.WithLabelValues("delete").Inc()
		v.log.Info("virtual node removed", "node", node.Name, "because", why)
	}
	if err := v.deletePods(ctx, id, node != nil); err != nil {
		return err
	}
	if err := v.deleteLease(ctx, id, node != nil); err != nil {
		return err
	}
	v.setReady(id, false, false)
	return nil
}

// deletePods deletes the pods bound to provider id's virtual node once it
// is gone, only when there may be some (known: a virtual node was just
// removed, or its Lease is still ours to delete). The agent is their
// kubelet: as the pod garbage collector does with the pods of a deleted
// Node, but now rather than a minute or more later, so their controllers
// make them again at once, on a node that is there. Only a removed node
// (grant revoked or refused, Peer gone) comes here: one merely NotReady or
// unreachable keeps its pods (docs/offload.md, "Failures").
func (v *Nodes) deletePods(ctx context.Context, id string, known bool) error {
	v.mu.Lock()
	known = known || v.leases[id] != nil
	v.mu.Unlock()
	if !known {
		return nil
	}
	name := offload.VirtualNodeName(id)
	switch _, err := v.cfg.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); {
	case err == nil:
		return nil // a Node of that name is there again (not ours): its pods are its own
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("read node %s before deleting its pods: %w", name, err)
	}
	pods := v.cfg.Client.CoreV1().Pods(metav1.NamespaceAll)
	list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", name).String()})
	if err != nil {
		return fmt.Errorf("list the pods of removed virtual node %s: %w", name, err)
	}
	deleted := 0
	for i := range list.Items {
		p := &list.Items[i]
		// Grace 0: no kubelet is left to confirm the containers stopped.
		// The UID: a pod of that name made since is not this one.
		err := v.cfg.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &p.UID}})
		switch {
		case err == nil:
			deleted++
			v.m.writes.WithLabelValues("delete-pod").Inc()
		case !apierrors.IsNotFound(err) && !apierrors.IsConflict(err):
			return fmt.Errorf("delete pod %s/%s of removed virtual node %s: %w", p.Namespace, p.Name, name, err)
		}
	}
	if deleted > 0 {
		v.log.Info("pods of a removed virtual node deleted, for their controllers to make them again", "node", name, "pods", deleted)
	}
	return nil
}

// errForeignNode is a Node or Lease under a virtual node's name that this
// agent did not make: it is left alone.
var errForeignNode = errors.New("not made by Flotilla (it lacks the labels " + offload.LabelVirtualNode + "=true and " +
	v1alpha1.LabelManagedBy + "=" + v1alpha1.ManagedByValue + "); left alone: rename or remove it to let the virtual node be made")

func errorReason(err error) string {
	switch {
	case errors.Is(err, errForeignNode):
		return "foreign"
	case apierrors.IsConflict(err):
		return "conflict"
	default:
		return "api"
	}
}

// setReady records what provider's virtual node says (present: whether
// there is one).
func (v *Nodes) setReady(id string, present, ready bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !present {
		delete(v.ready, id)
		v.m.ready.DeleteLabelValues(id)
		return
	}
	v.ready[id] = ready
	g := 0.0
	if ready {
		g = 1
	}
	v.m.ready.WithLabelValues(id).Set(g)
}

type virtualNodeMetrics struct {
	ready  *prometheus.GaugeVec
	errors *prometheus.CounterVec
	writes *prometheus.CounterVec
}

func newVirtualNodeMetrics(reg prometheus.Registerer) (*virtualNodeMetrics, error) {
	m := &virtualNodeMetrics{
		ready: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "flotilla_virtual_node_ready", Help: "1 while the virtual node of a provider is Ready, 0 while it is not; absent when there is none."}, []string{"peer"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_virtual_node_errors_total", Help: "Reconciles of a virtual node that failed, by reason (foreign: a Node or Lease of its name not made by Flotilla)."}, []string{"peer", "reason"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_virtual_node_writes_total", Help: "Writes to virtual nodes and their Leases, by what was written."}, []string{"write"}),
	}
	return m, ctrl.Register(reg, m.ready, m.errors, m.writes)
}
