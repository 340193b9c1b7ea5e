package graph

// rank orders phases from healthy to broken, so that a link shows the
// worse of its two sides.
var rank = map[string]int{
	"Connected":   0,
	"Negotiating": 1,
	"Discovered":  2,
	"":            3,
	"Degraded":    4,
	"Unreachable": 5,
	"Denied":      6,
}

// worst is the worse phase of a link's two sides.
func worst(l Link) string {
	p, r := "", -1
	for _, v := range []*View{l.AB, l.BA} {
		if v == nil {
			continue
		}
		k, ok := rank[v.Phase]
		if !ok {
			k = rank[""] // a phase of a newer agent: neither good nor bad
		}
		if k > r {
			p, r = v.Phase, k
		}
	}
	return p
}

// phaseColor is the colour a phase is drawn in.
func phaseColor(phase string) string {
	switch phase {
	case "Connected":
		return "#2e7d32"
	case "Negotiating", "Discovered":
		return "#757575"
	case "Degraded":
		return "#ef6c00"
	case "Unreachable", "Denied":
		return "#c62828"
	}
	return "#9e9e9e"
}

// Worst is the worse phase of the link's two sides, as it is drawn.
func (l Link) Worst() string { return worst(l) }
