package ipam

import (
	"net/netip"
	"testing"
)

func TestAsSeenByTranslatesByTheirClaims(t *testing.T) {
	l, _ := openTest(t, Options{})
	setLocals(t, l, testLocals)
	if err := l.RecordTheirView("p", pfx("10.0.0.0/16"), pfx("10.70.0.0/16")); err != nil {
		t.Fatal(err)
	}
	if err := l.RecordTheirView("q", pfx("10.0.0.0/16"), pfx("10.0.0.0/16")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, peer, ip string
		want           string // "" when not translated
	}{
		{name: "pod seen through the peer's view", peer: "p", ip: "10.0.3.4", want: "10.70.3.4"},
		{name: "first address", peer: "p", ip: "10.0.0.0", want: "10.70.0.0"},
		{name: "identity view", peer: "q", ip: "10.0.3.4", want: "10.0.3.4"},
		{name: "outside every claim", peer: "p", ip: "10.1.0.1"},
		{name: "peer without claims", peer: "r", ip: "10.0.3.4"},
		{name: "other family", peer: "p", ip: "fd00::1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := l.AsSeenBy(tc.peer, netip.MustParseAddr(tc.ip))
			switch {
			case tc.want == "" && ok:
				t.Fatalf("AsSeenBy(%s, %s) = %s, want no translation", tc.peer, tc.ip, got)
			case tc.want != "" && (!ok || got != netip.MustParseAddr(tc.want)):
				t.Fatalf("AsSeenBy(%s, %s) = %s, %v, want %s", tc.peer, tc.ip, got, ok, tc.want)
			}
		})
	}
}
