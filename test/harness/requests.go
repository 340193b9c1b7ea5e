package harness

import (
	"net/http"
	"slices"
	"sync"

	"k8s.io/client-go/rest"
)

// Requests records the requests made through a configuration wrapped by
// RecordRequests, each as "METHOD path".
type Requests struct {
	mu   sync.Mutex
	seen []string
}

// RecordRequests returns a copy of cfg whose clients record their
// requests in the Requests returned: those keep reports true for, or all
// of them when keep is nil.
func RecordRequests(cfg *rest.Config, keep func(*http.Request) bool) (*rest.Config, *Requests) {
	r := &Requests{}
	wrapped := rest.CopyConfig(cfg)
	wrapped.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if keep == nil || keep(req) {
				r.mu.Lock()
				r.seen = append(r.seen, req.Method+" "+req.URL.Path)
				r.mu.Unlock()
			}
			return rt.RoundTrip(req)
		})
	})
	return wrapped, r
}

// Writes keeps the requests that are not GETs (RecordRequests' keep).
func Writes(req *http.Request) bool { return req.Method != http.MethodGet }

// All returns the requests recorded so far.
func (r *Requests) All() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

// Take returns the requests recorded since the last Take, and forgets them.
func (r *Requests) Take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := r.seen
	r.seen = nil
	return seen
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
