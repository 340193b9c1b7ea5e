package harness

import (
	"net/netip"
	"testing"
)

func TestParseFlannelSubnet(t *testing.T) {
	got, err := parseFlannelSubnet([]byte("FLANNEL_NETWORK=10.0.0.0/16\nFLANNEL_SUBNET=10.0.2.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := flannelSubnet{Network: netip.MustParsePrefix("10.0.0.0/16"), Subnet: netip.MustParsePrefix("10.0.2.1/24"), MTU: 1450}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for _, bad := range []string{
		"",
		"FLANNEL_NETWORK=10.0.0.0/16\nFLANNEL_SUBNET=10.0.2.1/24\n",
		"FLANNEL_NETWORK=10.0.0.0/16\nFLANNEL_SUBNET=10.0.2.1\nFLANNEL_MTU=1450\n",
		"FLANNEL_NETWORK=10.0.0.0/16\nFLANNEL_SUBNET=10.0.2.1/24\nFLANNEL_MTU=12\n",
	} {
		if _, err := parseFlannelSubnet([]byte(bad)); err == nil {
			t.Errorf("%q: parsed, want an error", bad)
		}
	}
}
