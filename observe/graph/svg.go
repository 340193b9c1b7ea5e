package graph

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"
)

// The layout puts the clusters on a circle, in the graph's order, and
// links as straight lines between them. Detail shrinks as clusters grow
// in number, so that 3 show everything and 30 stay readable; whatever is
// left out is in each shape's <title>, which browsers show as a tooltip.
const (
	boxHeightLine = 14.0 // one line of a cluster's box
	margin        = 24.0
	legendHeight  = 28.0
	// fullDetail and edgeLabels: up to this many clusters boxes show
	// every fact, and links carry a text label.
	fullDetail = 6
	edgeLabels = 8
	// maxName is the longest name a box shows at large sizes.
	maxName = 20
	// minSize leaves room for the legend.
	minSize = 660
)

// layout is where each cluster sits and what its box shows.
type layout struct {
	w, h      float64 // the canvas
	boxW      float64
	lines     [][]string // per cluster, the lines its box shows
	x, y      []float64  // box centres
	edgeLabel bool
	stroke    float64
}

func newLayout(g Graph) layout {
	n := len(g.Clusters)
	l := layout{boxW: 190, edgeLabel: n <= edgeLabels, stroke: 2}
	if n > fullDetail {
		l.boxW = 130
	}
	if n > 12 {
		l.stroke = 1 // hundreds of links: thin enough to see through
	}
	maxLines := 1
	for _, c := range g.Clusters {
		var lines []string
		switch {
		case n <= fullDetail:
			lines = boxLines(g, c)
		case n <= 12:
			lines = []string{short(c.Label(), maxName), strings.Join(c.PodCIDRs, ",")}
		default:
			lines = []string{short(c.Label(), maxName)}
		}
		for i := range lines {
			lines[i] = short(lines[i], int(l.boxW/6.8))
		}
		maxLines = max(maxLines, len(lines))
		l.lines = append(l.lines, lines)
	}
	// The circle is long enough for every box and a gap.
	boxH := float64(maxLines)*boxHeightLine + 8
	// Neighbours at the top and bottom sit side by side: a box's
	// width apart at least.
	radius := max(180, float64(n)*(l.boxW+12)/(2*math.Pi))
	if n == 1 {
		radius = 0
	}
	for i := range n {
		// Start at the top and go clockwise.
		a := -math.Pi/2 + 2*math.Pi*float64(i)/float64(n)
		l.x = append(l.x, radius*math.Cos(a))
		l.y = append(l.y, radius*math.Sin(a))
	}
	// The canvas is the boxes' bounding box and a margin, the legend
	// above, wide enough for the legend.
	minX, maxX, minY, maxY := 0.0, 0.0, 0.0, 0.0
	for i := range n {
		minX, maxX = min(minX, l.x[i]), max(maxX, l.x[i])
		minY, maxY = min(minY, l.y[i]), max(maxY, l.y[i])
	}
	l.w = max(maxX-minX+l.boxW+2*margin, minSize)
	l.h = maxY - minY + boxH + 2*margin + legendHeight
	dx := l.w/2 - (minX+maxX)/2
	dy := margin + legendHeight + boxH/2 - minY
	for i := range n {
		l.x[i] += dx
		l.y[i] += dy
	}
	return l
}

// WriteSVG draws g as a standalone SVG document.
func WriteSVG(w io.Writer, g Graph) error {
	b := bufio.NewWriter(w)
	writeSVG(b, g)
	return b.Flush()
}

// SVG is g drawn as an <svg> element, for embedding in HTML.
func SVG(g Graph) string {
	var s strings.Builder
	writeSVG(&s, g)
	return s.String()
}

func writeSVG(w io.Writer, g Graph) {
	l := newLayout(g)
	index := map[string]int{}
	for i, c := range g.Clusters {
		index[c.ID] = i
	}
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11" role="img">`+"\n",
		l.w, l.h, l.w, l.h)
	fmt.Fprintf(w, "<title>Flotilla federation: %s, %s</title>\n", plural(len(g.Clusters), "cluster"), plural(len(g.Links), "link"))
	writeLegend(w)
	for _, k := range g.Links {
		i, j := index[k.A], index[k.B]
		a, b := g.Clusters[i], g.Clusters[j]
		var tip []string
		var short []string
		if k.AB != nil {
			tip = append(tip, k.AB.Lines(a.Label(), b.Label())...)
			short = append(short, orDash(k.AB.Phase))
		}
		if k.BA != nil {
			tip = append(tip, k.BA.Lines(b.Label(), a.Label())...)
			short = append(short, orDash(k.BA.Phase))
		}
		dash := ""
		if k.AB == nil || k.BA == nil {
			dash = ` stroke-dasharray="6 4"` // one side unheard
		}
		fmt.Fprintf(w, `<g class="link" data-a="%s" data-b="%s"><title>%s</title>`, attr(k.A), attr(k.B), text(strings.Join(tip, "\n")))
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.0f"%s/>`,
			l.x[i], l.y[i], l.x[j], l.y[j], phaseColor(k.Worst()), l.stroke, dash)
		if l.edgeLabel {
			if len(short) == 2 && short[0] == short[1] {
				short = short[:1]
			}
			fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10" fill="#333" stroke="#fff" stroke-width="3" paint-order="stroke">%s</text>`,
				(l.x[i]+l.x[j])/2, (l.y[i]+l.y[j])/2-3, text(strings.Join(short, " / ")))
		}
		fmt.Fprintln(w, "</g>")
	}
	for i, c := range g.Clusters {
		lines := l.lines[i]
		h := float64(len(lines))*boxHeightLine + 8
		dash := ""
		if !c.Reported {
			dash = ` stroke-dasharray="4 3"` // known only from its peers
		}
		fmt.Fprintf(w, `<g class="cluster" data-id="%s"><title>%s</title>`, attr(c.ID), text(strings.Join(g.Lines(c), "\n")))
		fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.0f" height="%.0f" rx="6" fill="#f5f8ff" stroke="#3949ab"%s/>`,
			l.x[i]-l.boxW/2, l.y[i]-h/2, l.boxW, h, dash)
		for k, line := range lines {
			weight := ""
			if k == 0 {
				weight = ` font-weight="bold"`
			}
			fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle"%s>%s</text>`,
				l.x[i], l.y[i]-h/2+4+float64(k+1)*boxHeightLine-3, weight, text(line))
		}
		fmt.Fprintln(w, "</g>")
	}
	fmt.Fprintln(w, "</svg>")
}

// boxLines are a cluster's facts in a box's width; the tooltip has them
// in full.
func boxLines(g Graph, c Cluster) []string {
	return g.lines(c, func(o Offload) string {
		var to []string
		for _, p := range o.Providers {
			name := p.ClusterID
			if pc, ok := g.Cluster(p.ClusterID); ok {
				name = pc.Label()
			}
			to = append(to, name)
		}
		return "ns " + o.Namespace + " → " + strings.Join(to, ",")
	})
}

// writeLegend explains the colours and dashes in a line at the top.
func writeLegend(w io.Writer) {
	x := margin
	for _, p := range []string{"Connected", "Negotiating", "Degraded", "Unreachable"} {
		label := p
		if p == "Unreachable" {
			label = "Unreachable/Denied"
		}
		fmt.Fprintf(w, `<line x1="%.0f" y1="16" x2="%.0f" y2="16" stroke="%s" stroke-width="3"/><text x="%.0f" y="20">%s</text>`+"\n",
			x, x+18, phaseColor(p), x+22, label)
		x += 36 + 6.5*float64(len(label))
	}
	fmt.Fprintf(w, `<line x1="%.0f" y1="16" x2="%.0f" y2="16" stroke="#9e9e9e" stroke-width="2" stroke-dasharray="6 4"/><text x="%.0f" y="20">one side not reported</text>`+"\n", x, x+18, x+22)
}

// short cuts s to n characters, marking the cut.
func short(s string, n int) string {
	r := []rune(s)
	if len(r) <= n || n < 2 {
		return s
	}
	return string(r[:n-1]) + "…"
}

// text escapes s as XML character data; names come from other clusters.
func text(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder does not fail
	return b.String()
}

func attr(s string) string { return text(s) }
