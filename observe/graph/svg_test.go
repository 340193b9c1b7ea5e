package graph

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// svgContent is what a parsed SVG shows: the clusters' ids, the links'
// ends, and every text and title.
type svgContent struct {
	clusters map[string]bool
	links    map[[2]string]bool
	texts    string
}

func parseSVG(t *testing.T, doc []byte) svgContent {
	t.Helper()
	c := svgContent{clusters: map[string]bool{}, links: map[[2]string]bool{}}
	d := xml.NewDecoder(bytes.NewReader(doc))
	var texts strings.Builder
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG does not parse as XML: %v\n%s", err, doc)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			attrs := map[string]string{}
			for _, a := range e.Attr {
				attrs[a.Name.Local] = a.Value
			}
			switch attrs["class"] {
			case "cluster":
				c.clusters[attrs["data-id"]] = true
			case "link":
				c.links[[2]string{attrs["data-a"], attrs["data-b"]}] = true
			}
		case xml.CharData:
			texts.Write(e)
			texts.WriteByte('\n')
		}
	}
	c.texts = texts.String()
	return c
}

func TestSVG(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reports []Report
	}{
		{"none", nil},
		{"alone", []Report{{Self: Self{ID: "11111111-aaaa", Name: "alpha", Nodes: 1}}}},
		{"three", threeClusters()},
		{"thirty", fullMesh(30)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := Build(tc.reports, now)
			var b bytes.Buffer
			if err := WriteSVG(&b, g); err != nil {
				t.Fatal(err)
			}
			got := parseSVG(t, b.Bytes())
			for _, c := range g.Clusters {
				if !got.clusters[c.ID] {
					t.Errorf("cluster %s (%s) is not drawn", c.Name, c.ID)
				}
				// Shortened on the canvas or not, the full name is in
				// the tooltip.
				if !strings.Contains(got.texts, c.Name) {
					t.Errorf("cluster name %q appears nowhere", c.Name)
				}
			}
			for _, l := range g.Links {
				if !got.links[[2]string{l.A, l.B}] {
					t.Errorf("link %s-%s is not drawn", l.A, l.B)
				}
			}
			if len(got.clusters) != len(g.Clusters) || len(got.links) != len(g.Links) {
				t.Errorf("drawn %d clusters and %d links, want %d and %d", len(got.clusters), len(got.links), len(g.Clusters), len(g.Links))
			}
			// docs/operations.md shows the three.
			if *update && tc.name == "three" {
				if err := os.WriteFile(filepath.Join("..", "..", "docs", "images", "graph-three.svg"), b.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// Names from other clusters cannot break the document.
func TestSVGEscapes(t *testing.T) {
	rs := threeClusters()
	rs[0].Self.Name = `<script>alert("x")</script> & "quotes"`
	var b bytes.Buffer
	if err := WriteSVG(&b, Build(rs, now)); err != nil {
		t.Fatal(err)
	}
	got := parseSVG(t, b.Bytes())
	if !strings.Contains(got.texts, `<script>alert("x")</script>`) {
		t.Errorf("the odd name is not shown as text:\n%s", b.String())
	}
	if strings.Contains(b.String(), "<script>") {
		t.Errorf("the name became markup:\n%s", b.String())
	}
}

// Names and IDs come from other clusters: whatever they hold, the SVG
// parses and the DOT keeps them inside their quotes.
func FuzzNames(f *testing.F) {
	f.Add("alpha", "11111111-aaaa", "Connected")
	f.Add(`<b>"x"&amp;`, "id\nwith\\newline", `"];evil`)
	f.Add("\x00\xff\xfe", "\u202e", "")
	f.Fuzz(func(t *testing.T, name, id, phase string) {
		rs := threeClusters()
		rs[0].Self.Name, rs[0].Self.ID = name, id
		rs[1].Peers[0].ID, rs[1].Peers[0].Name, rs[1].Peers[0].Phase = id, name, phase
		g := Build(rs, now)
		var svg bytes.Buffer
		if err := WriteSVG(&svg, g); err != nil {
			t.Fatal(err)
		}
		parseSVG(t, svg.Bytes())
		var dot bytes.Buffer
		if err := WriteDOT(&dot, g); err != nil {
			t.Fatal(err)
		}
		checkDOTStrings(t, dot.String())
	})
}

// checkDOTStrings checks that every line of a DOT document opens and
// closes its quoted strings: a name cannot end one early or span lines.
func checkDOTStrings(t *testing.T, dot string) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSuffix(dot, "\n"), "\n") {
		in := false
		for i := 0; i < len(line); i++ {
			switch {
			case in && line[i] == '\\':
				i++ // an escaped character
			case line[i] == '"':
				in = !in
			}
		}
		if in {
			t.Fatalf("a quoted string is left open on %q", line)
		}
	}
}
