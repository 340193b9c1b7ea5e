package peering

import (
	"context"
	"reflect"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// statusQueue writes Peer statuses from its own goroutine, so a slow or
// absent API server never stalls negotiation. It keeps only the newest
// status per peer, writes a change of phase or conditions at once, and
// traffic counters at most every countersEvery.
type statusQueue struct {
	e    *Engine
	wake chan struct{}

	mu      sync.Mutex
	pending map[string]queuedStatus
	written map[string]writtenStatus
}

type queuedStatus struct {
	name   string
	status v1alpha1.PeerStatus
}

type writtenStatus struct {
	status v1alpha1.PeerStatus
	at     time.Time
}

const countersEvery = 30 * time.Second

func (e *Engine) statusWriter() *statusQueue {
	if e.statusQ != nil {
		return e.statusQ
	}
	q := &statusQueue{e: e, wake: make(chan struct{}, 1), pending: map[string]queuedStatus{}, written: map[string]writtenStatus{}}
	e.statusQ = q
	go q.run(e.ctx)
	return q
}

func (q *statusQueue) post(id, name string, st v1alpha1.PeerStatus) {
	q.mu.Lock()
	q.pending[id] = queuedStatus{name: name, status: st}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// forget drops what is known of id's object, so the next status is written
// (and the object created) even if it equals the last one: the object was
// deleted.
func (q *statusQueue) forget(id string) {
	q.mu.Lock()
	delete(q.written, id)
	q.mu.Unlock()
}

func (q *statusQueue) run(ctx context.Context) {
	retry := time.NewTicker(time.Second)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.wake:
		case <-retry.C:
		}
		q.mu.Lock()
		batch := q.pending
		q.pending = map[string]queuedStatus{}
		q.mu.Unlock()
		for id, item := range batch {
			if !q.due(id, &item.status) {
				continue
			}
			err := q.e.cfg.Status.Write(ctx, id, item.name, item.status)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				q.e.log.Debug("cannot write Peer status; retrying", "peer", id, "err", err)
				q.mu.Lock()
				if _, newer := q.pending[id]; !newer {
					q.pending[id] = item
				}
				q.mu.Unlock()
				continue
			}
			q.mu.Lock()
			q.written[id] = writtenStatus{status: item.status, at: time.Now()}
			q.mu.Unlock()
		}
	}
}

// due keeps the transition times of unchanged conditions and reports
// whether st is worth writing.
func (q *statusQueue) due(id string, st *v1alpha1.PeerStatus) bool {
	q.mu.Lock()
	prev, ok := q.written[id]
	q.mu.Unlock()
	if !ok {
		return true
	}
	for i := range st.Conditions {
		if old := meta.FindStatusCondition(prev.status.Conditions, st.Conditions[i].Type); old != nil && old.Status == st.Conditions[i].Status {
			st.Conditions[i].LastTransitionTime = old.LastTransitionTime
		}
	}
	a, b := *st, prev.status
	a.ReceiveBytes, a.TransmitBytes, a.LastHandshake = 0, 0, nil
	b.ReceiveBytes, b.TransmitBytes, b.LastHandshake = 0, 0, nil
	if !reflect.DeepEqual(a, b) {
		return true
	}
	if reflect.DeepEqual(*st, prev.status) {
		return false
	}
	// Only counters or the handshake time moved. A first handshake is news.
	if prev.status.LastHandshake == nil && st.LastHandshake != nil {
		return true
	}
	return time.Since(prev.at) >= countersEvery
}
