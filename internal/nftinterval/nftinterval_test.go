package nftinterval

import (
	"bytes"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/google/nftables"
)

func ip(s string) [4]byte { return netip.MustParseAddr(s).As4() }

// dump renders prefixes as the kernel would dump their elements: in
// reverse order, as it walks its rbtree, with start elements carrying val.
func dump(val []byte, ps ...string) []nftables.SetElement {
	var out []nftables.SetElement
	for _, p := range ps {
		es := Of(netip.MustParsePrefix(p)).Elements()
		es[0].Val = val
		out = append(out, es...)
	}
	slices.Reverse(out)
	return out
}

// A prefix is the interval from its first address to the one after its
// last, flagged as an end; one reaching 255.255.255.255 has no end.
func TestOf(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		want   Interval
		elems  int
	}{
		{"10.80.0.0/16", Interval{Start: ip("10.80.0.0"), End: ip("10.81.0.0")}, 2},
		{"10.80.0.7/32", Interval{Start: ip("10.80.0.7"), End: ip("10.80.0.8")}, 2},
		{"10.255.255.0/24", Interval{Start: ip("10.255.255.0"), End: ip("11.0.0.0")}, 2},
		{"255.255.255.0/24", Interval{Start: ip("255.255.255.0"), Open: true}, 1},
		{"255.255.255.255/32", Interval{Start: ip("255.255.255.255"), Open: true}, 1},
		{"0.0.0.0/0", Interval{Open: true}, 1},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			got := Of(netip.MustParsePrefix(tc.prefix))
			if got != tc.want {
				t.Fatalf("Of(%s) = %+v, want %+v", tc.prefix, got, tc.want)
			}
			es := got.Elements()
			if len(es) != tc.elems || es[0].IntervalEnd || !bytes.Equal(es[0].Key, tc.want.Start[:]) {
				t.Fatalf("elements of %s: %+v", tc.prefix, es)
			}
			if tc.elems == 2 && (!es[1].IntervalEnd || !bytes.Equal(es[1].Key, tc.want.End[:])) {
				t.Fatalf("end element of %s: %+v", tc.prefix, es[1])
			}
		})
	}
}

// The elements the kernel dumps pair up into the intervals put in,
// whatever order they come in; an end with no start is stray, to be
// deleted; keys that are not IPv4 addresses are passed over.
func TestParse(t *testing.T) {
	a, b := Of(netip.MustParsePrefix("10.80.0.0/16")), Of(netip.MustParsePrefix("10.81.0.0/16"))
	top := Of(netip.MustParsePrefix("255.255.255.0/24"))
	end := func(s string) nftables.SetElement {
		k := ip(s)
		return nftables.SetElement{Key: k[:], IntervalEnd: true}
	}
	for _, tc := range []struct {
		name      string
		elems     []nftables.SetElement
		want      []Interval
		wantStray []nftables.SetElement
	}{
		{"none", nil, nil, nil},
		{"one", dump(nil, "10.80.0.0/16"), []Interval{a}, nil},
		// b's start and a's end share a key: the end sorts first.
		{"adjacent", dump(nil, "10.80.0.0/16", "10.81.0.0/16"), []Interval{a, b}, nil},
		{"adjacent, dumped in insertion order", slices.Concat(a.Elements(), b.Elements()), []Interval{a, b}, nil},
		{"unsorted", []nftables.SetElement{b.Elements()[1], a.Elements()[0], b.Elements()[0], a.Elements()[1]}, []Interval{a, b}, nil},
		{"up to 255.255.255.255", dump(nil, "255.255.255.0/24"), []Interval{top}, nil},
		{"open range after a closed one", dump(nil, "10.80.0.0/16", "255.255.255.0/24"), []Interval{a, top}, nil},
		{"start deleted", a.Elements()[1:], nil, []nftables.SetElement{end("10.81.0.0")}},
		{"end deleted", a.Elements()[:1], []Interval{{Start: a.Start, Open: true}}, nil},
		{"end deleted before another interval", slices.Concat(a.Elements()[:1], b.Elements()),
			[]Interval{{Start: a.Start, Open: true}, b}, nil},
		{"two stray ends", []nftables.SetElement{end("10.82.0.0"), end("10.81.0.0")}, nil,
			[]nftables.SetElement{end("10.81.0.0"), end("10.82.0.0")}},
		{"not IPv4 keys", []nftables.SetElement{{Key: []byte{1, 2, 3}}, {Key: make([]byte, 16), IntervalEnd: true}, a.Elements()[0], a.Elements()[1]},
			[]Interval{a}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, stray := Parse(tc.elems)
			var ivs []Interval
			for _, d := range got {
				ivs = append(ivs, d.Interval)
			}
			if !reflect.DeepEqual(ivs, tc.want) || !reflect.DeepEqual(stray, tc.wantStray) {
				t.Errorf("Parse = %+v, stray %+v; want %+v, stray %+v", ivs, stray, tc.want, tc.wantStray)
			}
		})
	}
}

// A verdict map's start element comes back with the interval, so that the
// caller reads its verdict; the end element's data is not taken for it.
func TestParseKeepsStartElement(t *testing.T) {
	elems := dump([]byte("jump a"), "10.80.0.0/16", "255.255.255.0/24")
	for i := range elems {
		if elems[i].IntervalEnd {
			elems[i].Val = []byte("on the end element")
		}
	}
	got, _ := Parse(elems)
	if len(got) != 2 {
		t.Fatalf("Parse = %+v, want 2 intervals", got)
	}
	for _, d := range got {
		if d.StartElement.IntervalEnd || !bytes.Equal(d.StartElement.Key, d.Start[:]) || string(d.StartElement.Val) != "jump a" {
			t.Errorf("start element of %+v: %+v", d.Interval, d.StartElement)
		}
	}
}

// Whatever another program wrote into our set, Parse neither panics nor
// invents: every interval starts at a start element it was given, and
// ends at an end element it was given unless open; every stray is an end
// it was given; and what prefixes render parses back to the same.
func FuzzParse(f *testing.F) {
	f.Add([]byte{10, 80, 0, 0, 0, 10, 81, 0, 0, 1, 10, 81, 0, 0, 0, 10, 82, 0, 0, 1})
	f.Add([]byte{255, 255, 255, 0, 0, 10, 81, 0, 0, 1})
	f.Add([]byte{1, 2, 3, 1, 4, 5, 6, 7, 8, 9})
	f.Fuzz(func(t *testing.T, b []byte) {
		// Five bytes an element: a key and a flag; a short tail is a
		// short key.
		var elems []nftables.SetElement
		starts, ends := map[[4]byte]bool{}, map[[4]byte]bool{}
		for len(b) > 0 {
			n := min(len(b), 5)
			e := nftables.SetElement{Key: slices.Clone(b[:min(n, 4)]), IntervalEnd: n == 5 && b[4]&1 == 1}
			if len(e.Key) == 4 {
				if e.IntervalEnd {
					ends[[4]byte(e.Key)] = true
				} else {
					starts[[4]byte(e.Key)] = true
				}
			}
			elems = append(elems, e)
			b = b[n:]
		}
		ivs, stray := Parse(elems)
		for _, d := range ivs {
			if !starts[d.Start] || !bytes.Equal(d.StartElement.Key, d.Start[:]) || d.StartElement.IntervalEnd {
				t.Fatalf("interval %+v does not start at a start element given", d)
			}
			if !d.Open && !ends[d.End] {
				t.Fatalf("interval %+v does not end at an end element given", d)
			}
		}
		for _, e := range stray {
			if !e.IntervalEnd || len(e.Key) != 4 || !ends[[4]byte(e.Key)] {
				t.Fatalf("stray %+v is not an end element given", e)
			}
		}

		// Prefixes from the same bytes, rendered and parsed back.
		var ps []netip.Prefix
		for k := range starts {
			p := netip.PrefixFrom(netip.AddrFrom4(k), 8+int(k[3]%25)).Masked()
			if !slices.ContainsFunc(ps, p.Overlaps) {
				ps = append(ps, p)
			}
		}
		var want []Interval
		for _, p := range ps {
			want = append(want, Of(p))
		}
		back, stray := Parse(ElementsOf(want))
		if len(stray) != 0 || len(back) != len(want) {
			t.Fatalf("%v: parsed back %+v, %d stray", ps, back, len(stray))
		}
		slices.SortFunc(want, func(a, b Interval) int { return slices.Compare(a.Start[:], b.Start[:]) })
		for i := range want {
			if back[i].Interval != want[i] {
				t.Fatalf("%v: parsed back %+v, want %+v", ps, back, want)
			}
		}
	})
}

func TestPrefixOfInterval(t *testing.T) {
	for _, s := range []string{"10.0.0.0/16", "10.70.2.0/24", "0.0.0.0/0", "255.255.255.0/24", "192.0.2.7/32"} {
		p := netip.MustParsePrefix(s)
		if got, ok := Of(p).Prefix(); !ok || got != p {
			t.Errorf("%s: %s, %v", s, got, ok)
		}
	}
	odd := Interval{Start: ip("10.0.0.0"), End: ip("10.0.0.3")}
	if p, ok := odd.Prefix(); ok {
		t.Errorf("10.0.0.0-10.0.0.2 read as %s", p)
	}
}
