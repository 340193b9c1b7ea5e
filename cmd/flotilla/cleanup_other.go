//go:build !linux

package main

import (
	"errors"
	"io"

	"github.com/spf13/pflag"
)

// hostCleanup, where the data path does not build, only carries the names
// the agent ran with to the Job's cleanup on the node, which checks them
// and fills in the defaults.
type hostCleanup struct{}

func addHostCleanupFlags(fs *pflag.FlagSet) *hostCleanup {
	fs.String("wireguard-interface", "", "name of the WireGuard interface (default: the agent's)")
	fs.Int("route-table", 0, "routing table our routes are in (default: the agent's)")
	fs.Int("route-protocol", 0, "route protocol number that tags our routes (default: the agent's; never one of the kernel's or a routing daemon's)")
	fs.String("nft-table", "", "name of our nftables table (family ip; default: the agent's)")
	fs.Int("fabric-table", 0, "routing table of the fabric's routes (docs/fabric.md; default: the agent's)")
	fs.String("fabric-nft-table", "", "name of the fabric's nftables table (family ip; default: the agent's)")
	return &hostCleanup{}
}

// checkForJob has nothing to check here: the cleanup on the node refuses a
// route protocol that is not ours before it removes anything.
func (*hostCleanup) checkForJob() error { return nil }

func (*hostCleanup) run(io.Writer) error {
	return errors.New("the network objects are on the gateway node, not here: give --node NODE to clean it up by a Job with your rights (or run flotilla cleanup as root on the node itself)")
}
