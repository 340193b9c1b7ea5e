package peerapi

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/ctrl"
	"github.com/flotilla-io/flotilla/peering"
)

// fieldOwner is the agent's field manager for server-side apply, the one
// it installs its CRD with.
const fieldOwner = "flotilla"

// statusWriter writes Peer statuses from its own goroutines, so a slow or
// absent API server never stalls negotiation. A work queue keyed by peer
// holds each peer once, with only its newest state; a failed write is
// retried with per-peer exponential backoff, and all writes share a rate
// limit. A peer's entries end with its last write.
type statusWriter struct {
	client client.Client
	cache  client.Reader
	log    *slog.Logger
	now    func() time.Time
	loop   *ctrl.Controller[string]
	queue  ctrl.Queue[string]
	// writes bounds the write rate to the API server, whatever the
	// federation does.
	writes *rate.Limiter
	// unnamedWait delays the states of peers that have not spoken yet.
	unnamedWait time.Duration

	mu      sync.Mutex
	seq     uint64
	pending map[string]queued
	// failing is the last error logged per peer, so an error that repeats
	// is logged once per change.
	failing map[string]string
	// withViews holds the peers whose written status holds their views,
	// so the step is logged when they first appear.
	withViews map[string]bool
	// labelled holds, per peer, the labels this writer's last apply of the
	// object set, until a write fails: the informer's copy lags a create
	// or a relabel by a watch event (hundreds of ms on a loaded API
	// server), and without this every write in that time would create or
	// label the object again, a request in front of the status it writes.
	labelled map[string]map[string]string
	// conditions holds, per peer, the conditions of this writer's last
	// apply of its status: the writer alone sets them, so they, not a
	// cache that may not show that apply yet, say when each last
	// changed (a transition time read from a stale copy would move).
	conditions map[string][]metav1.Condition
}

type queued struct {
	state peering.PeerState
	seq   uint64    // tells a newer state from the one being written
	at    time.Time // when it was queued, for the debug log of its write
	// retired, when set, asks for the Peer's deletion instead, and says
	// why (peering.Publisher.Retire).
	retired string
}

// The writer's limit on status writes, whatever the federation does. A
// write is at most requestsPerWrite requests: create or label the object,
// apply its status.
const (
	writeRate        = 20 // per second
	writeBurst       = 50
	requestsPerWrite = 2
)

// writeClientConfig is cfg for the client that writes statuses: it allows
// the writer's own rate. Otherwise client-go's default (5 requests/s in
// bursts of 10) is the limit in force: past a start-up's first few writes
// each waits up to 200 ms, and so does the first view a Peer shows.
func writeClientConfig(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst = writeRate*requestsPerWrite, writeBurst*requestsPerWrite
	c.RateLimiter = nil // QPS and Burst make the client's limiter
	return c
}

func newStatusWriter(c client.Client, cache client.Reader, log *slog.Logger) (*statusWriter, error) {
	w := &statusWriter{
		client: c, cache: cache, log: log, now: time.Now,
		writes: rate.NewLimiter(rate.Limit(writeRate), writeBurst), unnamedWait: unnamedWait,
		pending: map[string]queued{}, failing: map[string]string{}, withViews: map[string]bool{},
		labelled: map[string]map[string]string{}, conditions: map[string][]metav1.Condition{},
	}
	var err error
	w.loop, err = ctrl.New(ctrl.Config[string]{
		Name: "peer_status", Workers: statusWorkers, Reconcile: ctrl.WithoutDelay(w.reconcile),
		RateLimiter: workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, time.Minute),
			&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(10), 50)},
		),
	})
	if err != nil {
		return nil, fmt.Errorf("Peer status writer: %w", err)
	}
	w.queue = w.loop.Queue()
	return w, nil
}

// unnamedWait is how long the state of a peer that has not spoken yet
// waits before it is written. Its statement, with its name, follows its
// discovery within tens of milliseconds (hundreds at the start of a
// federation on a loaded host): written together, the object is created
// once, already labelled, instead of created and then labelled (two more
// requests in a row before its first view shows). At 100 ms two Peers in
// five were written unnamed first at the start of 5 clusters under load,
// and their views showed about 0.8 s later; a member that never speaks
// shows a second later, which nobody watching notices.
const unnamedWait = time.Second

func (w *statusWriter) publish(s peering.PeerState) {
	w.mu.Lock()
	w.seq++
	w.pending[s.ClusterID] = queued{state: s, seq: w.seq, at: w.now()}
	w.mu.Unlock()
	if s.Name == "" {
		w.queue.AddAfter(s.ClusterID, w.unnamedWait)
		return
	}
	w.queue.Add(s.ClusterID)
}

// retire queues the deletion of id's Peer in place of any state.
func (w *statusWriter) retire(id, why string) {
	w.mu.Lock()
	w.seq++
	w.pending[id] = queued{seq: w.seq, retired: why, at: w.now()}
	w.mu.Unlock()
	w.queue.Add(id)
}

func (w *statusWriter) withdraw(id string) {
	w.mu.Lock()
	delete(w.pending, id)
	delete(w.withViews, id)
	delete(w.labelled, id)
	delete(w.conditions, id)
	w.mu.Unlock()
}

// entries counts the peers the writer holds anything for.
func (w *statusWriter) entries() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(w.pending)
	for id := range w.failing {
		if _, ok := w.pending[id]; !ok {
			n++
		}
	}
	return n
}

// run writes queued states until ctx ends.
func (w *statusWriter) run(ctx context.Context) error {
	return w.loop.Run(ctx, nil)
}

// reconcile writes id's newest queued state, or deletes its Peer once
// retired; an error queues it again after its backoff.
func (w *statusWriter) reconcile(ctx context.Context, id string) error {
	w.mu.Lock()
	q, ok := w.pending[id]
	w.mu.Unlock()
	if !ok { // withdrawn
		w.mu.Lock()
		delete(w.failing, id)
		w.mu.Unlock()
		return nil
	}
	if err := w.writes.Wait(ctx); err != nil {
		return fmt.Errorf("wait to write Peer %s: %w", id, err)
	}
	var err error
	began := w.now()
	requests := 1
	if q.retired != "" {
		err = w.remove(ctx, id, q.retired)
	} else {
		requests, err = w.write(ctx, q.state)
	}
	w.log.Debug("Peer status write", "peer", id, "views", len(q.state.TheirNetworks) > 0, "requests", requests,
		"queued", began.Sub(q.at), "took", w.now().Sub(began), "err", err)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		delete(w.labelled, id) // what the object holds is not known
		delete(w.conditions, id)
		if ctx.Err() != nil {
			return err
		}
		if w.failing[id] != err.Error() {
			w.failing[id] = err.Error()
			w.log.Error("cannot write Peer status; retrying with backoff (check that the API server is reachable and the agent may patch peers/status)", "peer", id, "err", err)
		}
		return err
	}
	if _, ok := w.failing[id]; ok {
		delete(w.failing, id)
		w.log.Info("Peer status written again", "peer", id)
	}
	if cur, ok := w.pending[id]; ok && cur.seq == q.seq {
		delete(w.pending, id)
	}
	switch views := len(q.state.TheirNetworks) > 0; {
	case q.retired != "":
		delete(w.withViews, id)
		delete(w.labelled, id)
		delete(w.conditions, id)
	case views && !w.withViews[id]:
		w.withViews[id] = true
		peering.LogStep(w.log, peering.StepStatus, id, time.Time{})
	case !views:
		delete(w.withViews, id)
	}
	return nil
}

// write creates the Peer of s when missing (or brings its labels up to
// date) and applies its status. The informer's copy says whether the
// object exists, which labels it has and which of them this writer set,
// and holds the conditions' transition times; until it shows this
// writer's last apply, that apply stands in for it (labelled).
func (w *statusWriter) write(ctx context.Context, s peering.PeerState) (requests int, err error) {
	id := s.ClusterID
	var cur v1alpha1.Peer
	exists := true
	if err := w.cache.Get(ctx, client.ObjectKey{Name: id}, &cur); apierrors.IsNotFound(err) {
		exists = false
	} else if err != nil {
		return 0, fmt.Errorf("read Peer %s: %w", id, err)
	}
	labels := peerLabels(s.Name)
	w.mu.Lock()
	applied, ok := w.labelled[id]
	w.mu.Unlock()
	// The writer's own apply of these very labels, not yet in the cache.
	fresh := ok && maps.Equal(applied, labels) && (!exists || !hasLabels(cur.Labels, labels))
	if !fresh && (!exists || !hasLabels(cur.Labels, labels) || setButUnwanted(&cur, labels)) {
		requests++
		if err := w.label(ctx, id, labels); err != nil {
			return requests, err
		}
	}
	prev := cur.Status.Conditions
	w.mu.Lock()
	if last, ok := w.conditions[id]; ok {
		prev = last
	}
	w.mu.Unlock()
	st := statusOf(s, prev, w.now())
	status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
	if err != nil {
		return requests, fmt.Errorf("status of Peer %s: %w", id, err)
	}
	obj := peerObject(id)
	obj.Object["status"] = status
	// Server-side apply: fields this owner no longer sets (a handshake
	// time, a view) are removed, and nothing needs the object's version.
	requests++
	err = w.client.Status().Patch(ctx, obj, client.Apply, client.FieldOwner(fieldOwner), client.ForceOwnership)
	if fresh && apierrors.IsNotFound(err) {
		// Deleted since the writer created it, before the cache saw
		// either: create it again now rather than after a backoff.
		requests += 2
		if err := w.label(ctx, id, labels); err != nil {
			return requests, err
		}
		obj = peerObject(id)
		obj.Object["status"] = status
		err = w.client.Status().Patch(ctx, obj, client.Apply, client.FieldOwner(fieldOwner), client.ForceOwnership)
	}
	if err != nil {
		return requests, fmt.Errorf("apply status of Peer %s: %w", id, err)
	}
	w.mu.Lock()
	w.conditions[id] = st.Conditions
	w.mu.Unlock()
	return requests, nil
}

// label creates id's Peer or brings the labels this writer sets on it to
// labels, and remembers them.
func (w *statusWriter) label(ctx context.Context, id string, labels map[string]string) error {
	obj := peerObject(id)
	obj.SetLabels(labels)
	// Server-side apply: a label this owner set before and omits now
	// (the peer stopped announcing it) goes; the admin's labels stay.
	if err := w.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("create or label Peer %s: %w", id, err)
	}
	w.mu.Lock()
	w.labelled[id] = maps.Clone(labels)
	w.mu.Unlock()
	return nil
}

// remove deletes id's Peer, retired (why), when no admin decided
// anything in it: a spec of theirs (a decision, a grant, limits) is
// theirs to drop. The preconditions keep a spec written meanwhile.
func (w *statusWriter) remove(ctx context.Context, id, why string) error {
	var cur v1alpha1.Peer
	if err := w.cache.Get(ctx, client.ObjectKey{Name: id}, &cur); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("read Peer %s: %w", id, err)
	}
	if !equality.Semantic.DeepEqual(cur.Spec, v1alpha1.PeerSpec{}) {
		w.log.Warn("Peer of a member gone for good kept: its spec holds an admin's decision; delete it when it is of no use (if the cluster came back under a new identity, once that Peer has what it needs)", "peer", id, "name", cur.Status.ClusterName, "why", why)
		return nil
	}
	pre := metav1.Preconditions{UID: &cur.UID, ResourceVersion: &cur.ResourceVersion}
	err := w.client.Delete(ctx, &cur, client.Preconditions(pre))
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("delete Peer %s of a member gone for good (%s): %w", id, why, err)
	}
	w.log.Info("Peer of a member gone for good deleted", "peer", id, "name", cur.Status.ClusterName, "why", why)
	return nil
}

func peerObject(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Peer"))
	u.SetName(name)
	return u
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// setButUnwanted reports whether the writer set a label of p (as its
// managed fields say) that is not among labels.
func setButUnwanted(p *v1alpha1.Peer, labels map[string]string) bool {
	for _, k := range labelsSet(p) {
		if _, ok := labels[k]; !ok {
			return true
		}
	}
	return false
}

// labelsSet are the label keys of p this writer's apply holds, read from
// its managed fields (which the cache keeps: keepOwnApply).
func labelsSet(p *v1alpha1.Peer) []string {
	var keys []string
	for _, e := range p.ManagedFields {
		if !ownApply(e) || e.FieldsV1 == nil {
			continue
		}
		var fields struct {
			Metadata struct {
				Labels map[string]json.RawMessage `json:"f:labels"`
			} `json:"f:metadata"`
		}
		if err := json.Unmarshal(e.FieldsV1.Raw, &fields); err != nil {
			continue // not the format of fieldsV1: nothing known set
		}
		for f := range fields.Metadata.Labels {
			if k, ok := strings.CutPrefix(f, "f:"); ok {
				keys = append(keys, k)
			}
		}
	}
	return keys
}

// ownApply says whether e is this writer's apply of the object itself
// (its labels), not of its status.
func ownApply(e metav1.ManagedFieldsEntry) bool {
	return e.Manager == fieldOwner && e.Operation == metav1.ManagedFieldsOperationApply && e.Subresource == ""
}

// keepOwnApply is the cache's transform: of a Peer's managed fields it
// keeps only the writer's own apply of its labels, the one entry the
// writer reads, so the cache holds little more than without any.
func keepOwnApply(in any) (any, error) {
	obj, err := meta.Accessor(in)
	if err != nil || obj.GetManagedFields() == nil {
		return in, nil
	}
	var kept []metav1.ManagedFieldsEntry
	for _, e := range obj.GetManagedFields() {
		if ownApply(e) {
			kept = append(kept, e)
		}
	}
	obj.SetManagedFields(kept)
	return in, nil
}
