package ha

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// Replicas follows the agent's pods in its namespace, to tell whether a
// replica other than this one could take the Lease: an active replica
// that cannot renew keeps its data path when none could.
//
// An informer follows the pods, but its watch, once broken (the API
// server unreachable for a while), is retried with a backoff of up to a
// minute: a pod made in the meantime, once the API server answers again,
// would stay unseen, and a replica cut off again would count itself
// alone and keep its data path while that pod takes the Lease. So while
// the informer's watch is down, Replicas also lists the pods itself,
// every period, and counts what the last list holds until the informer
// has caught up with it.
type Replicas struct {
	inf  cache.SharedIndexInformer
	pods kubeclient.ListWatcher[*corev1.PodList]
	// self is this replica's pod; empty outside a pod.
	self  string
	every time.Duration
	log   *slog.Logger

	mu sync.Mutex
	// watching: the informer's watch is open.
	watching bool
	// listed is the pods as Replicas last listed them while the informer
	// was not watching; nil: none, or the informer has caught up with it.
	listed *corev1.PodList
	// listedAt is the newest resource version of a pod in listed: the
	// informer has caught up with the list once it has seen that pod's
	// version (the list's own version is the whole store's, which other
	// objects' writes move past the last pod event).
	listedAt string
}

// NewReplicas follows the agent's pods (AgentSelector) in namespace; self
// is this replica's own pod, not counted. While the informer's watch is
// down, Replicas lists the pods every period.
func NewReplicas(kube kubeclient.Interface, namespace, self string, every time.Duration, log *slog.Logger) *Replicas {
	r := &Replicas{pods: kube.CoreV1().Pods(namespace), self: self, every: every, log: log}
	r.inf = kubeclient.NewInformer(&corev1.Pod{}, trackedPods{r}, nil)
	r.inf.SetTransform(kubeclient.DropManagedFields)
	return r
}

// Run follows the pods until ctx ends, and logs which other replicas
// could take the Lease each time that changes.
func (r *Replicas) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() { defer close(done); r.inf.RunWithContext(ctx) }()
	defer func() { <-done }()
	t := time.NewTicker(r.every)
	defer t.Stop()
	var logged []string // nil: nothing logged yet
	for {
		if r.inf.HasSynced() {
			if !r.isWatching() {
				r.list(ctx)
			}
			if others := r.others(); logged == nil || !slices.Equal(others, logged) {
				r.log.Info("agent replicas that could take the Lease", "others", strings.Join(others, ","))
				logged = append([]string{}, others...)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// list lists the pods, for others to count while the informer has not
// caught up; an error (the API server still unreachable) keeps the last
// list.
func (r *Replicas) list(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, r.every)
	defer cancel()
	l, err := r.pods.List(ctx, metav1.ListOptions{LabelSelector: AgentSelector})
	if err != nil {
		return
	}
	newest := "0"
	for i := range l.Items {
		if v := l.Items[i].ResourceVersion; notOlder(v, newest) {
			newest = v
		}
	}
	r.mu.Lock()
	r.listed, r.listedAt = l, newest
	r.mu.Unlock()
}

// Others reports whether another of the agent's pods, as last seen,
// could take the Lease: one that has not ended (succeeded or failed).
// Before the pods were first listed, it says one could. A pod made while
// the API server cannot be reached is not seen: docs/ha.md says so.
func (r *Replicas) Others() bool {
	return !r.inf.HasSynced() || len(r.others()) > 0
}

// Collectors are Replicas' metrics: how many other replicas could take
// the Lease.
func (r *Replicas) Collectors() []prometheus.Collector {
	return []prometheus.Collector{prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "flotilla_gateway_other_replicas",
		Help: "Agent pods other than this replica's that could take the Lease, as this replica last saw them; 0: it keeps its data path while the API server does not answer.",
	}, func() float64 { return float64(len(r.others())) })}
}

// others names the other pods that could take the Lease, sorted.
func (r *Replicas) others() []string {
	var names []string
	for _, p := range r.seen() {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

// seen is the agent's other pods that have not ended (succeeded or
// failed), as last seen: those the informer holds and, until it has
// caught up with it, those the last list held; each once, the
// informer's first.
func (r *Replicas) seen() []*corev1.Pod {
	var pods []*corev1.Pod
	add := func(p *corev1.Pod) {
		if p.Name == r.self || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed ||
			slices.ContainsFunc(pods, func(q *corev1.Pod) bool { return q.Name == p.Name }) {
			return
		}
		pods = append(pods, p)
	}
	for _, o := range r.inf.GetStore().List() {
		add(o.(*corev1.Pod))
	}
	r.mu.Lock()
	listed := r.listed
	if listed != nil && r.watching && notOlder(r.inf.LastSyncResourceVersion(), r.listedAt) {
		r.listed, listed = nil, nil
	}
	r.mu.Unlock()
	if listed != nil {
		for i := range listed.Items {
			add(&listed.Items[i])
		}
	}
	return pods
}

// notOlder reports whether resource version a is at least b. The API
// server's are etcd's revisions, numbers; versions that are not numbers
// compare as older, so a list is counted until the next replaces it.
func notOlder(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	return errA == nil && errB == nil && x >= y
}

func (r *Replicas) isWatching() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.watching
}

func (r *Replicas) setWatching(w bool) {
	r.mu.Lock()
	r.watching = w
	r.mu.Unlock()
}

// trackedPods lists and watches the agent's pods for the informer, and
// tells Replicas whether the informer's watch is open.
type trackedPods struct{ r *Replicas }

func (t trackedPods) List(ctx context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
	o.LabelSelector = AgentSelector
	return t.r.pods.List(ctx, o)
}

func (t trackedPods) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	o.LabelSelector = AgentSelector
	w, err := t.r.pods.Watch(ctx, o)
	if err != nil {
		t.r.setWatching(false)
		return nil, err
	}
	t.r.setWatching(true)
	return &trackedWatch{Interface: w, r: t.r}, nil
}

// trackedWatch is the informer's watch; the informer stops it once it
// ends, broken or not.
type trackedWatch struct {
	watch.Interface
	r *Replicas
}

func (w *trackedWatch) Stop() {
	w.r.setWatching(false)
	w.Interface.Stop()
}

// Addrs returns the addresses, with port, of the other agent pods as last
// seen that have an IP, have not ended and are not being deleted: where
// a heartbeat reaches them (the agent's pods use the host's network, and
// all listen on the same port). A pod being deleted stops as a standby
// (it takes nothing early once stopping): its silence is no reason to
// fence.
func (r *Replicas) Addrs(port uint16) func() []netip.AddrPort {
	return func() []netip.AddrPort {
		var addrs []netip.AddrPort
		for _, p := range r.seen() {
			if p.DeletionTimestamp != nil {
				continue
			}
			if ip, err := netip.ParseAddr(p.Status.PodIP); err == nil {
				addrs = append(addrs, netip.AddrPortFrom(ip.Unmap(), port))
			}
		}
		return addrs
	}
}
