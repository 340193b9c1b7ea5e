package remote

import "sync"

// Answering is whether a provider's API server answers, as the watches
// a session keeps on it report: every consumer-side session with a
// provider tracks it the same way.
type Answering struct {
	mu  sync.Mutex
	err error
}

// Report records the outcome of a list or watch (nil: the provider
// answered) and reports whether it turned the provider from answering
// to failing, or back.
func (a *Answering) Report(err error) (changed bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	changed = (a.err == nil) != (err == nil)
	a.err = err
	return changed
}

// Err is the provider's last failure, nil while it answers.
func (a *Answering) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}
