package graph

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// WriteDOT writes g in Graphviz's DOT language: an undirected graph, a
// box per cluster, an edge per link labelled with both sides' views.
func WriteDOT(w io.Writer, g Graph) error {
	b := bufio.NewWriter(w)
	fmt.Fprintln(b, "graph federation {")
	fmt.Fprintln(b, "  layout=circo;")
	fmt.Fprintln(b, "  node [shape=box, style=rounded, fontname=\"sans-serif\", fontsize=10];")
	fmt.Fprintln(b, "  edge [fontname=\"sans-serif\", fontsize=8];")
	for _, c := range g.Clusters {
		style := ""
		if !c.Reported {
			style = ", style=\"rounded,dashed\""
		}
		fmt.Fprintf(b, "  %s [label=%s%s];\n", dotQuote(c.ID), dotLabel(g.Lines(c)), style)
	}
	for _, l := range g.Links {
		a, _ := g.Cluster(l.A)
		bc, _ := g.Cluster(l.B)
		var lines []string
		color := phaseColor(worst(l))
		if l.AB != nil {
			lines = append(lines, l.AB.Lines(a.Label(), bc.Label())...)
		}
		if l.BA != nil {
			lines = append(lines, l.BA.Lines(bc.Label(), a.Label())...)
		}
		fmt.Fprintf(b, "  %s -- %s [label=%s, color=%s];\n", dotQuote(l.A), dotQuote(l.B), dotLabel(lines), dotQuote(color))
	}
	fmt.Fprintln(b, "}")
	return b.Flush()
}

// dotLabel joins lines left-aligned (\l ends each).
func dotLabel(lines []string) string {
	var s strings.Builder
	for _, l := range lines {
		s.WriteString(dotEscape(l))
		s.WriteString(`\l`)
	}
	return `"` + s.String() + `"`
}

func dotQuote(s string) string { return `"` + dotEscape(s) + `"` }

// dotEscape escapes what DOT reads specially in a quoted string; the
// names come from other clusters.
func dotEscape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\r", "")
	return r.Replace(s)
}
