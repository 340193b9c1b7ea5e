package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Debian's python3 with python-zeroconf: an mDNS/DNS-SD implementation
// written independently of ours.
var zeroconf = harness.Requirement{
	Name: "python3-zeroconf",
	Check: func() error {
		return exec.Command("/usr/bin/python3", "-c", "import zeroconf").Run()
	},
	Fix: "apt-get install -y --no-install-recommends python3-zeroconf",
}

const zeroconfBrowse = `
import sys, time
from zeroconf import Zeroconf, ServiceBrowser, ServiceListener
zc = Zeroconf(interfaces=[sys.argv[1]])
found = []
class L(ServiceListener):
    def add_service(self, zc, t, name): found.append(name)
    def update_service(self, zc, t, name): pass
    def remove_service(self, zc, t, name): pass
ServiceBrowser(zc, "_flotilla._udp.local.", L())
deadline = time.time() + 15
while time.time() < deadline and not found:
    time.sleep(0.1)
for name in found:
    info = zc.get_service_info("_flotilla._udp.local.", name, timeout=3000)
    if info:
        txt = {k.decode(): (v or b"").decode() for k, v in info.properties.items()}
        print("FOUND", name, info.port, ",".join(info.parsed_addresses()), "id=" + txt.get("id", ""), "fp=" + txt.get("fp", ""))
zc.close()
`

const zeroconfRegister = `
import sys, socket, time
from zeroconf import Zeroconf, ServiceInfo
ip, cluster, fp = sys.argv[1], sys.argv[2], sys.argv[3]
zc = Zeroconf(interfaces=[ip])
info = ServiceInfo("_flotilla._udp.local.", cluster + "._flotilla._udp.local.",
    addresses=[socket.inet_aton(ip)], port=7946, server=cluster + ".local.",
    properties={"txtvers": "1", "id": cluster, "fp": fp, "v": "1"})
zc.register_service(info)
print("registered", flush=True)
time.sleep(60)
`

// The agent's mDNS advert is found by another implementation's browser,
// and the agent's browser finds a service another implementation
// advertises.
func TestMDNSInteroperatesWithZeroconf(t *testing.T) {
	requireAll(t)
	harness.Require(t, zeroconf)
	env := harness.New(t)
	lan := env.NewLAN("lan")
	cs := federation.New(t, env, federation.Options{PodCIDRs: []string{"10.0.0.0/16"}, LAN: lan})
	a := cs[0]
	z := env.NewSite("z", harness.SiteOptions{LAN: lan})
	a.StartAgent(t)
	waitFor(t, a.Agent, 60*time.Second, func() error { return expectBodyIn(a.Site, "http://127.0.0.1:9470/readyz", "ok") })
	id := regexp.MustCompile(`msg=identity clusterID=(c[a-z2-7]+)`).FindStringSubmatch(a.Agent.Log())
	if id == nil {
		t.Fatalf("no identity line in the agent's log:\n%s", a.Agent.Tail(20))
	}

	t.Run("zeroconf browser finds the agent", func(t *testing.T) {
		out, err := z.Exec(context.Background(), "/usr/bin/python3", "-c", zeroconfBrowse, z.Addr.String())
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("FOUND %s._flotilla._udp.local. 7946 %s id=%s fp=", id[1], a.Site.Addr, id[1])
		if !strings.Contains(string(out), want) {
			t.Fatalf("zeroconf's browser did not find the agent as %q:\n%s", want, out)
		}
	})

	t.Run("agent finds a zeroconf service", func(t *testing.T) {
		other, err := identity.Generate()
		if err != nil {
			t.Fatal(err)
		}
		tok, err := discovery.ParseFederationKey(a.Args[indexOf(a.Args, "--federation-key")+1])
		if err != nil {
			t.Fatal(err)
		}
		z.Start("zeroconf", "/usr/bin/python3", "-c", zeroconfRegister, z.Addr.String(), other.ClusterID(), discovery.Fingerprint(tok.Key))
		found := regexp.MustCompile(`msg="mDNS candidate" .*addr=` + regexp.QuoteMeta(z.Addr.String()) + `:7946 cluster=` + other.ClusterID())
		waitFor(t, a.Agent, 45*time.Second, func() error {
			if !found.MatchString(a.Agent.Log()) {
				return fmt.Errorf("the agent has not found the zeroconf service of %s at %s", other.ClusterID(), z.Addr)
			}
			return nil
		})
	})
}
