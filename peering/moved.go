package peering

// ViewsMoved tells the engine that views changed in the ledger behind its
// back: the agent remapped those that came to overlap a local network. The
// engine reads every peer's views again and applies the data path.
func (e *Engine) ViewsMoved() {
	e.input(func() {
		for _, p := range e.peers {
			p.viewsFor = nil
		}
	})
}
