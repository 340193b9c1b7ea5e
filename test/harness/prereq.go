package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Requirement is something a test needs from the machine.
type Requirement struct {
	Name string
	// Check returns nil when the requirement is met.
	Check func() error
	// Fix is the command that provides it.
	Fix string
}

// InCI reports whether tests run under CI (CI=true), where a missing
// prerequisite is a failure rather than a skip.
func InCI() bool { return os.Getenv("CI") == "true" }

// Require fails (CI=true) or skips the test unless every requirement holds.
func (e *Env) Require(reqs ...Requirement) { e.t.Helper(); Require(e.t, reqs...) }

// Require fails (CI=true) or skips t unless every requirement holds.
func Require(t TB, reqs ...Requirement) {
	t.Helper()
	for _, r := range reqs {
		if err := r.Check(); err != nil {
			msg := fmt.Sprintf("missing prerequisite %s: %v; fix: %s", r.Name, err, r.Fix)
			if InCI() {
				t.Fatalf("%s", msg)
			}
			t.Skipf("%s (set CI=true to make this a failure)", msg)
		}
	}
}

func binary(name, fix string) Requirement {
	return Requirement{
		Name: name,
		Check: func() error {
			_, err := exec.LookPath(name)
			return err
		},
		Fix: fix,
	}
}

const aptFix = "apt-get install -y --no-install-recommends "

var (
	// Root: network namespaces and control planes need root.
	Root = Requirement{
		Name: "root",
		Check: func() error {
			if os.Geteuid() != 0 {
				return fmt.Errorf("running as uid %d", os.Geteuid())
			}
			return nil
		},
		Fix: "run the tests as root (sudo make test)",
	}
	IPRoute2 = binary("ip", aptFix+"iproute2")
	Ping     = binary("ping", aptFix+"iputils-ping")
	Etcd     = binary("etcd", aptFix+"etcd-server")
	NFT      = binary("nft", aptFix+"nftables")
	WG       = binary("wg", aptFix+"wireguard-tools")
	IPerf3   = binary("iperf3", aptFix+"iperf3")
	// Chromium: the dashboard's test looks at the page in Debian's
	// headless browser.
	Chromium = binary("chromium", aptFix+"chromium")
	// Promtool checks and unit-tests deploy/monitoring's alert rules
	// (Debian ships it in the prometheus package).
	Promtool = binary("promtool", aptFix+"prometheus")
	// Kube: kube-apiserver, kube-controller-manager, kube-scheduler and
	// kubectl of the pinned version, built into the cache.
	Kube = Requirement{
		Name: "kubernetes binaries " + KubeVersion,
		Check: func() error {
			for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"} {
				if _, err := os.Stat(filepath.Join(KubeBinDir(), b)); err != nil {
					return err
				}
			}
			return nil
		},
		Fix: "make kube-binaries",
	}
	// Real nodes: Debian's containerd, runc and CNI plugins, and nsenter.
	Containerd = binary("containerd", aptFix+"containerd")
	Runc       = binary("runc", aptFix+"runc")
	Nsenter    = binary("nsenter", aptFix+"util-linux")
	CNIPlugins = Requirement{
		Name: "CNI plugins in " + CNIBinDir,
		Check: func() error {
			for _, b := range []string{"bridge", "host-local", "loopback"} {
				if _, err := os.Stat(filepath.Join(CNIBinDir, b)); err != nil {
					return err
				}
			}
			return nil
		},
		Fix: aptFix + "containernetworking-plugins",
	}
	// IPTables: iptables with the nft backend, for the CNI masquerade
	// shapes of Node.InstallMasquerade (the nft shapes need only NFT).
	IPTables = binary("iptables-nft-restore", aptFix+"iptables")
	// KubeNode: kubelet and kube-proxy of the pinned version, built into
	// the cache beside the control-plane binaries.
	KubeNode = Requirement{
		Name: "kubelet and kube-proxy " + KubeVersion,
		Check: func() error {
			for _, b := range []string{"kubelet", "kube-proxy"} {
				if _, err := os.Stat(filepath.Join(KubeBinDir(), b)); err != nil {
					return err
				}
			}
			return nil
		},
		Fix: "make kube-binaries",
	}
	// CgroupV1Memory: real nodes' kubelets run with the cgroupfs driver on
	// cgroup v1 (docs/testing.md); their cgroups need its memory
	// hierarchy.
	CgroupV1Memory = Requirement{
		Name: "a cgroup v1 memory hierarchy",
		Check: func() error {
			for _, h := range cgroupHierarchies() {
				if filepath.Base(h) == "memory" {
					return nil
				}
			}
			return fmt.Errorf("no cgroup v1 memory hierarchy among %v", cgroupHierarchies())
		},
		Fix: "boot with cgroup v1 (systemd.unified_cgroup_hierarchy=0), as the machines real nodes were measured on",
	}
	// NeedsNetwork is everything sites and pods need.
	NeedsNetwork = []Requirement{Root, IPRoute2, Ping}
	// NeedsControlPlane is everything control planes need.
	NeedsControlPlane = []Requirement{Root, Etcd, Kube}
	// NeedsNodes is everything clusters of real nodes need.
	NeedsNodes = []Requirement{Root, IPRoute2, Ping, Etcd, Kube, KubeNode, CoreDNS, Containerd, Runc, CNIPlugins, NFT, Nsenter, CgroupV1Memory}
)

// CNIBinDir is where Debian's containernetworking-plugins installs the
// plugins.
const CNIBinDir = "/usr/lib/cni"

func requireRoot(t TB) { t.Helper(); Require(t, Root) }
