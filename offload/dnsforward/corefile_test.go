package dnsforward

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

const kubeadmCorefile = `.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf
    cache 30
    loop
    reload
    loadbalance
}
`

// The block goes in and out leaving the rest byte for byte, whatever the
// Corefile's last byte, and a second write replaces the first.
func TestBlockInAndOut(t *testing.T) {
	one, two := Block(netip.MustParseAddr("10.96.0.53"), nil), Block(netip.MustParseAddr("10.96.7.7"), nil)
	for name, before := range map[string]string{
		"kubeadm's":           kubeadmCorefile,
		"no final newline":    strings.TrimSuffix(kubeadmCorefile, "\n"),
		"empty":               "",
		"an operator's block": kubeadmCorefile + "\nexample.org:53 {\n    forward . 192.0.2.1\n}\n",
	} {
		t.Run(name, func(t *testing.T) {
			with, err := WithBlock(before, one)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(with, before) || !strings.Contains(with, "forward . 10.96.0.53:53\n") {
				t.Fatalf("with the block:\n%s", with)
			}
			again, err := WithBlock(with, one)
			if err != nil || again != with {
				t.Fatalf("the same block again changed the Corefile (%v):\n%s", err, again)
			}
			moved, err := WithBlock(with, two)
			if err != nil || strings.Contains(moved, "10.96.0.53") || strings.Count(moved, beginMarker) != 1 {
				t.Fatalf("the block replaced (%v):\n%s", err, moved)
			}
			after, err := WithoutBlock(moved)
			if err != nil || after != before {
				t.Fatalf("without the block (%v): %q, want %q", err, after, before)
			}
		})
	}
}

// What an operator adds after the block or changes before it stays when
// the block goes.
func TestWithoutBlockKeepsEditsAround(t *testing.T) {
	with, err := WithBlock(kubeadmCorefile, Block(netip.MustParseAddr("10.96.0.53"), nil))
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(with, "cache 30", "cache 60", 1) + "example.org:53 {\n}\n"
	got, err := WithoutBlock(edited)
	want := strings.Replace(kubeadmCorefile, "cache 30", "cache 60", 1) + "example.org:53 {\n}\n"
	if err != nil || got != want {
		t.Fatalf("without the block (%v): %q, want %q", err, got, want)
	}
}

// Markers someone broke: the Corefile is left as it is, with an error
// that says so.
func TestBrokenMarkers(t *testing.T) {
	block := Block(netip.MustParseAddr("10.96.0.53"), nil)
	with, _ := WithBlock(kubeadmCorefile, block)
	for name, corefile := range map[string]string{
		"begin without end": strings.Replace(with, endMarker, "", 1),
		"end without begin": strings.Replace(with, beginMarker, "", 1),
		"end before begin":  kubeadmCorefile + endMarker + "\n" + beginMarker + "\n",
		"two blocks":        with + "\n" + block,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := WithBlock(corefile, block); !errors.Is(err, ErrMarkers) {
				t.Errorf("WithBlock: %v, want ErrMarkers", err)
			}
			if got, err := WithoutBlock(corefile); !errors.Is(err, ErrMarkers) || got != corefile {
				t.Errorf("WithoutBlock: %v, want ErrMarkers and the Corefile unchanged", err)
			}
		})
	}
	// A marker inside a line is not a marker.
	inline := kubeadmCorefile + "# note: " + beginMarker + "\n"
	if got, err := WithoutBlock(inline); err != nil || got != inline {
		t.Errorf("a marker inside a line: %v, %q", err, got)
	}
}

// Whatever an operator's Corefile holds, the agent's block comes out as it
// went in, or the Corefile is refused unchanged.
func FuzzBlockRoundTrip(f *testing.F) {
	f.Add(kubeadmCorefile)
	f.Add("")
	f.Add(beginMarker)
	f.Add("x\n" + endMarker + "\n")
	block := Block(netip.MustParseAddr("10.96.0.53"), nil)
	f.Fuzz(func(t *testing.T, corefile string) {
		with, err := WithBlock(corefile, block)
		if err != nil {
			if !errors.Is(err, ErrMarkers) {
				t.Fatalf("WithBlock: %v", err)
			}
			if got, err := WithoutBlock(corefile); err == nil || got != corefile {
				t.Fatalf("WithoutBlock of a refused Corefile: %v, %q", err, got)
			}
			return
		}
		if !strings.Contains(with, block) {
			t.Fatalf("block missing from %q", with)
		}
		without, err := WithoutBlock(with)
		if err != nil {
			t.Fatalf("WithoutBlock: %v", err)
		}
		if plain, _ := WithoutBlock(corefile); without != plain {
			t.Fatalf("round trip: %q, want %q", without, plain)
		}
	})
}

// The reverse zones of the views go in one server block of their own,
// forwarded to the same address; a prefix inside another, or given
// twice, once; none, no such block.
func TestBlockReverseZones(t *testing.T) {
	addr := netip.MustParseAddr("10.96.0.53")
	p := netip.MustParsePrefix
	for _, tc := range []struct {
		name    string
		reverse []netip.Prefix
		want    string // the reverse block's first line; "" none
	}{
		{"none", nil, ""},
		{"one", []netip.Prefix{p("10.70.0.0/16")}, "10.70.0.0/16:53 {"},
		{"sorted, each once, masked", []netip.Prefix{p("10.71.0.0/20"), p("10.70.1.2/16"), p("10.70.0.0/16")}, "10.70.0.0/16:53 10.71.0.0/20:53 {"},
		{"inside another", []netip.Prefix{p("10.70.8.0/24"), p("10.70.0.0/16")}, "10.70.0.0/16:53 {"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			block := Block(addr, tc.reverse)
			blocks := strings.Count(block, "forward . 10.96.0.53:53\n")
			switch {
			case tc.want == "" && blocks != 1:
				t.Errorf("block with a reverse block:\n%s", block)
			case tc.want != "" && (blocks != 2 || !strings.Contains(block, "}\n"+tc.want+"\n    errors\n")):
				t.Errorf("block:\n%s\nwant a second server block %q forwarding to 10.96.0.53:53", block, tc.want)
			}
			if !strings.HasPrefix(block, beginMarker+"\nclusterset.local:53 {\n") || !strings.HasSuffix(block, "}\n"+endMarker+"\n") {
				t.Errorf("block not between the markers, clusterset.local first:\n%s", block)
			}
		})
	}
}
