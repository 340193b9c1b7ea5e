package tunnel

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// withProtocolNames points the rt_protos lookup at a directory holding the
// given rt_protos.d files, for the test's duration.
func withProtocolNames(t *testing.T, files map[string]string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "rt_protos.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	saved := rtProtosDirs
	rtProtosDirs = []string{dir}
	t.Cleanup(func() { rtProtosDirs = saved })
}

// The numbers of the kernel and of routing daemons are refused with a
// message naming the owner and the number to pass instead; so are numbers
// this host's iproute2 configuration names, unless the name is ours.
func TestCheckRouteProtocol(t *testing.T) {
	withProtocolNames(t, map[string]string{
		"rt_protos":              "# reserved\n4\tstatic\n",
		"rt_protos.d/local.conf": "77  mydaemon # ours? no\n0x50 calico\n",
		"rt_protos.d/ours.conf":  "102 flotilla\n",
		"rt_protos.d/skip.txt":   "90 ignored\n", // iproute2 reads only *.conf
	})
	for _, tc := range []struct {
		n    int
		want string // in the error; empty: accepted
	}{
		{DefaultRouteProtocol, ""},
		{5, ""},
		{90, ""},
		{255, ""},
		{0, "the kernel"},
		{1, "ICMP redirects"},
		{2, "the kernel"},
		{3, "boot"},
		{4, "static"},
		{11, "Zebra"},
		{12, "BIRD"},
		{16, "DHCP"},
		{17, "multicast"},
		{18, "keepalived"},
		{42, "Babel"},
		{99, "Open/R"},
		{186, "bgpd"},
		{187, "isisd"},
		{188, "ospfd"},
		{189, "ripd"},
		{192, "eigrpd"},
		{196, "staticd"},
		{77, `named "mydaemon" in `},
		{0x50, `"calico"`},
		{-1, "out of range"},
		{256, "out of range"},
	} {
		err := CheckRouteProtocol(tc.n)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("protocol %d: %v, want accepted", tc.n, err)
		case tc.want != "" && err == nil:
			t.Errorf("protocol %d accepted, want refused (%s)", tc.n, tc.want)
		case tc.want != "" && (!strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "the default 102")):
			t.Errorf("protocol %d: %q, want it to say %q and offer the default 102", tc.n, err, tc.want)
		}
	}
}

// The tunnel's Config refuses what cleanup refuses: one check for both.
func TestConfigRefusesProtocolsOfOthers(t *testing.T) {
	for _, n := range []int{12, 186, 256} {
		c := Config{RouteProtocol: n}
		c.setDefaults()
		if err := c.validate(); err == nil || err.Error() != CheckRouteProtocol(n).Error() {
			t.Errorf("config with route protocol %d: %v, want %v", n, err, CheckRouteProtocol(n))
		}
	}
}
