package graph

import (
	"fmt"
	"strings"
)

// Ranges prints views as "range" when addressed as is, "range→as" when
// remapped.
func Ranges(vs []NetworkView) string {
	parts := make([]string, 0, len(vs))
	for _, v := range vs {
		if v.As == "" || v.As == v.Range {
			parts = append(parts, v.Range)
		} else {
			parts = append(parts, v.Range+"→"+v.As)
		}
	}
	return strings.Join(parts, ",")
}

// Age prints a number of seconds as kubectl prints ages: 42s, 3m, 5h, 2d.
func Age(seconds int64) string {
	switch {
	case seconds < 120:
		return fmt.Sprintf("%ds", seconds)
	case seconds < 2*3600:
		return fmt.Sprintf("%dm", seconds/60)
	case seconds < 2*86400:
		return fmt.Sprintf("%dh", seconds/3600)
	}
	return fmt.Sprintf("%dd", seconds/86400)
}

// Bytes prints a byte count in binary units: 512 B, 1.5 KiB, 3.2 GiB.
func Bytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// Handshake is the view's handshake age, "never" without one.
func (v *View) Handshake() string {
	if v.HandshakeAgeSeconds == nil {
		return "never"
	}
	return Age(*v.HandshakeAgeSeconds) + " ago"
}

// Counters is "rx 1.2 MiB, tx 300 B", or "" when the counters were not read.
func (v *View) Counters() string {
	var parts []string
	if v.ReceiveBytes != nil {
		parts = append(parts, "rx "+Bytes(*v.ReceiveBytes))
	}
	if v.TransmitBytes != nil {
		parts = append(parts, "tx "+Bytes(*v.TransmitBytes))
	}
	return strings.Join(parts, ", ")
}

// Lines describes what the side from sees of to, a line per fact, for
// DOT labels and SVG tooltips.
func (v *View) Lines(from, to string) []string {
	head := fmt.Sprintf("%s sees %s: %s", from, to, orDash(v.Phase))
	if v.Endpoint != "" {
		head += " via " + v.Endpoint
	}
	lines := []string{head, "handshake " + v.Handshake()}
	if t := v.Counters(); t != "" {
		lines[1] += ", " + t
	}
	if r := Ranges(v.Theirs); r != "" {
		lines = append(lines, to+" pods as "+r)
	}
	if r := Ranges(v.Mine); r != "" {
		lines = append(lines, from+" pods seen there as "+r)
	}
	if v.Hosts != nil {
		lines = append(lines, fmt.Sprintf("%s hosts %s in %s%s", from, to, v.Hosts.Namespace, state(v.Hosts)))
	}
	if v.OffloadsTo != nil {
		lines = append(lines, fmt.Sprintf("%s offloads to %s in %s%s", from, to, v.OffloadsTo.Namespace, state(v.OffloadsTo)))
	}
	return lines
}

func state(g *Grant) string {
	if g.State == "" {
		return ""
	}
	return " (" + g.State + ")"
}

// Lines describes a cluster, a line per fact; providers of its offloaded
// namespaces are named as in g.
func (g Graph) Lines(c Cluster) []string {
	return g.lines(c, g.OffloadLine)
}

// lines are c's facts, its offloaded namespaces each as offload says.
func (g Graph) lines(c Cluster, offload func(Offload) string) []string {
	lines := []string{c.Label()}
	if c.Name != "" {
		lines = append(lines, "id "+c.ID)
	}
	if len(c.PodCIDRs) > 0 {
		lines = append(lines, "pods "+strings.Join(c.PodCIDRs, ","))
	}
	if c.Nodes != nil {
		lines = append(lines, plural(*c.Nodes, "node"))
	}
	for _, o := range c.Offloads {
		lines = append(lines, offload(o))
	}
	return lines
}

// OffloadLine is "namespace shop offloaded to beta (Ready)".
func (g Graph) OffloadLine(o Offload) string {
	to := make([]string, 0, len(o.Providers))
	for _, p := range o.Providers {
		name := p.ClusterID
		if c, ok := g.Cluster(p.ClusterID); ok {
			name = c.Label()
		}
		to = append(to, name)
	}
	s := "namespace " + o.Namespace + " offloaded"
	if len(to) > 0 {
		s += " to " + strings.Join(to, ",")
	}
	if o.Phase != "" {
		s += " (" + o.Phase + ")"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
