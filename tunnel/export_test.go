package tunnel

// Resync reconciles reading every kind of owned object back from the
// kernel, as the periodic resync does; for benchmarks.
func Resync(t *Tunnel) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reconcileLocked(fullAll)
}
