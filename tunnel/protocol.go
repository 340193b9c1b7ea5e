package tunnel

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// reservedProtocol is a route protocol number that someone else tags its
// routes with.
type reservedProtocol struct {
	name  string // as iproute2 names it
	owner string // who puts routes with it in the kernel
}

// reservedProtocols are the numbers the kernel interprets (0-4) and those
// assigned to routing daemons in Linux's include/uapi/linux/rtnetlink.h,
// iproute2's rt_protos and FRR's rt_protos.d/frr.conf. A route with one of
// them is someone else's even on a host where that daemon is not running
// today: it may be tomorrow, and our cleanup must never take its routes.
var reservedProtocols = map[int]reservedProtocol{
	0:   {"unspec", "the kernel (no protocol)"},
	1:   {"redirect", "the kernel (routes from ICMP redirects)"},
	2:   {"kernel", "the kernel (routes it adds for addresses)"},
	3:   {"boot", "ip route add without 'proto' and boot-time configuration (Calico's default)"},
	4:   {"static", "the administrator (static routes)"},
	8:   {"gated", "GateD"},
	9:   {"ra", "router advertisements (RDISC/ND)"},
	10:  {"mrt", "Merit MRT"},
	11:  {"zebra", "Zebra (Quagga, FRR)"},
	12:  {"bird", "BIRD (also Calico's BGP)"},
	13:  {"dnrouted", "the DECnet routing daemon"},
	14:  {"xorp", "XORP"},
	15:  {"ntk", "Netsukuku"},
	16:  {"dhcp", "DHCP clients (systemd-networkd, dhcpcd, NetworkManager)"},
	17:  {"mrouted", "the multicast routing daemon"},
	18:  {"keepalived", "keepalived"},
	42:  {"babel", "the Babel daemon"},
	99:  {"openr", "Open/R"},
	186: {"bgp", "FRR bgpd"},
	187: {"isis", "FRR isisd"},
	188: {"ospf", "FRR ospfd"},
	189: {"rip", "FRR ripd"},
	190: {"ripng", "FRR ripngd"},
	191: {"nhrp", "FRR nhrpd"},
	192: {"eigrp", "FRR eigrpd"},
	193: {"ldp", "FRR ldpd"},
	194: {"sharp", "FRR sharpd"},
	195: {"pbr", "FRR pbrd"},
	196: {"static", "FRR staticd"},
	197: {"openfabric", "FRR fabricd"},
	198: {"srte", "FRR pathd (segment routing)"},
}

// protocolNameOfOurs is the name an operator may give our protocol number
// in rt_protos so that `ip route` shows it; it does not make the number
// someone else's.
const protocolNameOfOurs = "flotilla"

// rtProtosDirs are where iproute2 reads protocol names from: /etc
// overrides /usr/share and /usr/lib in newer releases.
var rtProtosDirs = []string{"/etc/iproute2", "/usr/share/iproute2", "/usr/lib/iproute2"}

// CheckRouteProtocol refuses a route protocol number for tagging our
// routes that the kernel or a routing daemon uses, or that this host's
// iproute2 configuration names: routes with it would be taken for ours,
// and cleanup would remove them. One check for the tunnel's Config and
// `flotilla cleanup --route-protocol`.
func CheckRouteProtocol(n int) error {
	instead := fmt.Sprintf("pass a number no routing daemon uses, such as the default %d", DefaultRouteProtocol)
	if n < 0 || n > 255 {
		return fmt.Errorf("route protocol %d: out of range 0..255 (the kernel keeps 8 bits); %s", n, instead)
	}
	if r, ok := reservedProtocols[n]; ok {
		return fmt.Errorf("route protocol %d (%s) belongs to %s: its routes would be taken for ours; %s", n, r.name, r.owner, instead)
	}
	name, file, err := protocolNamedOnHost(n)
	if err != nil {
		return fmt.Errorf("route protocol %d: %w", n, err)
	}
	if name != "" && name != protocolNameOfOurs {
		return fmt.Errorf("route protocol %d is named %q in %s, so something on this host uses it; %s", n, name, file, instead)
	}
	return nil
}

// protocolNamedOnHost returns the name this host's iproute2 configuration
// gives protocol number n, and the file that does, if any.
func protocolNamedOnHost(n int) (name, file string, err error) {
	for _, dir := range rtProtosDirs {
		files := []string{filepath.Join(dir, "rt_protos")}
		more, _ := filepath.Glob(filepath.Join(dir, "rt_protos.d", "*.conf"))
		for _, f := range append(files, more...) {
			name, err := protocolNameIn(f, n)
			if err != nil {
				return "", "", err
			}
			if name != "" {
				return name, f, nil
			}
		}
	}
	return "", "", nil
}

// protocolNameIn reads an rt_protos file ("number name" a line, '#'
// comments, numbers in C notation) and returns the name of n, if listed.
// A missing file lists nothing.
func protocolNameIn(path string, n int) (string, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read protocol names: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		if v, err := strconv.ParseInt(fields[0], 0, 32); err == nil && int(v) == n {
			return fields[1], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read protocol names from %s: %w", path, err)
	}
	return "", nil
}
