package tunnel

import (
	"encoding/binary"
	"net/netip"
	"reflect"
	"testing"

	"github.com/flotilla-io/flotilla/internal/nftinterval"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The elements the kernel dumps for an interval map pair up into the
// intervals we put in, whatever order they come in, adjacent intervals
// included; an end with no start is reported stray.
func TestParseIntervals(t *testing.T) {
	jumpA := verdict{code: int32(expr.VerdictJump), chain: "egress-a"}
	jumpB := verdict{code: int32(expr.VerdictJump), chain: "egress-b"}
	a := intervals([]netip.Prefix{pfx("10.80.0.0/16")}, "egress-a")
	b := intervals([]netip.Prefix{pfx("10.81.0.0/16")}, "egress-b")
	top := intervals([]netip.Prefix{pfx("255.255.255.0/24")}, "egress-b")
	// The kernel dumps verdicts as nested attributes, not VerdictData.
	dumped := func(ivs ...[]interval) []nftables.SetElement {
		var out []nftables.SetElement
		for _, iv := range ivs {
			for _, e := range elementsOf(iv, true) {
				if e.VerdictData != nil {
					e.Val = verdictAttrs(t, e.VerdictData)
					e.VerdictData = nil
				}
				out = append(out, e)
			}
		}
		// Reverse, as the kernel dumps an rbtree.
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
		return out
	}
	tests := []struct {
		name      string
		elems     []nftables.SetElement
		want      []interval
		wantStray int
	}{
		{"one interval", dumped(a), []interval{{nftinterval.Interval{Start: [4]byte{10, 80, 0, 0}, End: [4]byte{10, 81, 0, 0}}, jumpA}}, 0},
		{"adjacent intervals", dumped(a, b), []interval{
			{nftinterval.Interval{Start: [4]byte{10, 80, 0, 0}, End: [4]byte{10, 81, 0, 0}}, jumpA},
			{nftinterval.Interval{Start: [4]byte{10, 81, 0, 0}, End: [4]byte{10, 82, 0, 0}}, jumpB},
		}, 0},
		{"interval to the last address", dumped(top), []interval{{nftinterval.Interval{Start: [4]byte{255, 255, 255, 0}, Open: true}, jumpB}}, 0},
		{"start deleted", dumped(a)[:1], nil, 1},
		{"end deleted", dumped(a)[1:], []interval{{nftinterval.Interval{Start: [4]byte{10, 80, 0, 0}, Open: true}, jumpA}}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, stray := parseIntervals(tc.elems)
			if !reflect.DeepEqual(got, tc.want) || len(stray) != tc.wantStray {
				t.Errorf("got %+v, %d stray; want %+v, %d stray", got, len(stray), tc.want, tc.wantStray)
			}
		})
	}
}

// verdictAttrs encodes a verdict as the kernel dumps it in an element.
func verdictAttrs(t *testing.T, v *expr.Verdict) []byte {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.Uint32(unix.NFTA_VERDICT_CODE, uint32(v.Kind))
	ae.String(unix.NFTA_VERDICT_CHAIN, v.Chain)
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
