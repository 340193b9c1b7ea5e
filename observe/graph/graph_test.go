package graph

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden with what the renderers write now")

// golden compares got with testdata/name, or rewrites it under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to write it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what the renderer writes now (go test -update rewrites it after a deliberate change):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestGolden(t *testing.T) {
	g := Build(threeClusters(), now)
	for _, tc := range []struct {
		file  string
		write func(*bytes.Buffer, Graph) error
	}{
		{"three.dot.golden", func(b *bytes.Buffer, g Graph) error { return WriteDOT(b, g) }},
		{"three.json.golden", func(b *bytes.Buffer, g Graph) error { return WriteJSON(b, g) }},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.write(&b, g); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.file, b.Bytes())
		})
	}
}

// One cluster's report alone: its peers appear with what it knows of
// them (their pod ranges, no node count), and each link has only its side.
func TestBuildOneReport(t *testing.T) {
	g := Build(threeClusters()[:1], now)
	if len(g.Clusters) != 3 || len(g.Links) != 2 {
		t.Fatalf("got %d clusters and %d links, want 3 and 2: %+v", len(g.Clusters), len(g.Links), g)
	}
	beta, ok := g.Cluster("22222222-bbbb")
	if !ok || beta.Reported || beta.Nodes != nil || len(beta.PodCIDRs) != 1 || beta.PodCIDRs[0] != "10.1.0.0/16" {
		t.Errorf("beta = %+v, want unreported, no node count, pods 10.1.0.0/16 as alpha's Peer says", beta)
	}
	for _, l := range g.Links {
		if l.AB == nil || l.BA != nil {
			t.Errorf("link %s-%s: want alpha's side only, got %+v / %+v", l.A, l.B, l.AB, l.BA)
		}
	}
}

// A report whose own cluster ID is unknown meets its peers' reports
// through the name they know it by.
func TestBuildIDFromPeersName(t *testing.T) {
	rs := threeClusters()
	rs[2].Self.ID = ""
	g := Build(rs, now)
	if len(g.Clusters) != 3 {
		t.Fatalf("got %d clusters, want 3 (gamma found by name): %+v", len(g.Clusters), g.Clusters)
	}
	for _, l := range g.Links {
		if l.AB == nil || l.BA == nil {
			t.Errorf("link %s-%s: want both sides, got %+v / %+v", l.A, l.B, l.AB, l.BA)
		}
	}
}

// A cluster nobody names is shown by its alias (the kubeconfig's
// context); a name its peers give wins over the alias.
func TestBuildAlias(t *testing.T) {
	rs := threeClusters()
	for i := range rs {
		rs[i].Self.Name, rs[i].Self.Alias = "", "ctx-"+rs[i].Self.ID
	}
	g := Build(rs, now)
	if a, _ := g.Cluster("11111111-aaaa"); a.Name != "alpha" {
		t.Errorf("alpha is named %q, want alpha as its peers name it", a.Name)
	}
	g = Build(rs[:1], now)
	if a, _ := g.Cluster("11111111-aaaa"); a.Name != "ctx-11111111-aaaa" {
		t.Errorf("alpha alone is named %q, want its alias", a.Name)
	}
}

// The same kubeconfig given twice draws the cluster once.
func TestBuildSameReportTwice(t *testing.T) {
	rs := threeClusters()
	g := Build(append(rs, rs[0]), now)
	a, _ := g.Cluster("11111111-aaaa")
	if len(g.Clusters) != 3 || len(g.Links) != 3 || len(a.Offloads) != 1 {
		t.Errorf("%d clusters, %d links, alpha's offloads %v: want 3, 3 and shop once", len(g.Clusters), len(g.Links), a.Offloads)
	}
}

// A Peer for the reporting cluster itself, or without an ID, makes no
// link and no cluster.
func TestBuildIgnoresSelfPeers(t *testing.T) {
	rs := threeClusters()[:1]
	rs[0].Peers = append(rs[0].Peers, PeerReport{ID: rs[0].Self.ID, Name: "me"}, PeerReport{Name: "nobody"})
	g := Build(rs, now)
	if len(g.Clusters) != 3 || len(g.Links) != 2 {
		t.Errorf("%d clusters and %d links, want 3 and 2: %+v", len(g.Clusters), len(g.Links), g)
	}
}

// No report at all: empty lists, for scripts that range over them.
func TestEmptyGraphJSON(t *testing.T) {
	var b bytes.Buffer
	if err := WriteJSON(&b, Build(nil, now)); err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != "{\n  \"clusters\": [],\n  \"links\": []\n}\n" {
		t.Errorf("empty graph as JSON: %q", got)
	}
}
