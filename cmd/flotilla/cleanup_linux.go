package main

import (
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/flotilla-io/flotilla/fabric"
	"github.com/flotilla-io/flotilla/tunnel"
)

// hostCleanup is the cleanup of this host, with the names the agent ran
// with.
type hostCleanup struct {
	ifname, nftTable, fabricNFT string
	table, proto, fabricTable   int
}

func addHostCleanupFlags(fs *pflag.FlagSet) *hostCleanup {
	h := &hostCleanup{}
	fs.StringVar(&h.ifname, "wireguard-interface", tunnel.DefaultInterface, "name of the WireGuard interface")
	fs.IntVar(&h.table, "route-table", tunnel.DefaultRouteTable, "routing table our routes are in")
	fs.IntVar(&h.proto, "route-protocol", tunnel.DefaultRouteProtocol, "route protocol number that tags our routes (never one of the kernel's or a routing daemon's)")
	fs.StringVar(&h.nftTable, "nft-table", tunnel.DefaultNFTable, "name of our nftables table (family ip)")
	fs.IntVar(&h.fabricTable, "fabric-table", fabric.DefaultTable, "routing table of the fabric's routes (docs/fabric.md)")
	fs.StringVar(&h.fabricNFT, "fabric-nft-table", fabric.DefaultNFTable, "name of the fabric's nftables table (family ip)")
	return h
}

// checkForJob refuses, before a Job is made, a route protocol that is
// not ours.
func (h *hostCleanup) checkForJob() error {
	if err := tunnel.CheckRouteProtocol(h.proto); err != nil {
		return fmt.Errorf("--route-protocol: %w; nothing removed", err)
	}
	return nil
}

func (h *hostCleanup) run(stdout io.Writer) error {
	return cleanup(stdout, h.ifname, h.table, h.proto, h.nftTable, h.fabricTable, h.fabricNFT)
}

func cleanup(stdout io.Writer, ifname string, table, proto int, nftTable string, fabricTable int, fabricNFT string) error {
	// Checked here, before the Config turns 0 into the default: nothing
	// may be removed on a protocol that is not ours.
	if err := tunnel.CheckRouteProtocol(proto); err != nil {
		return fmt.Errorf("--route-protocol: %w; nothing removed", err)
	}
	err := tunnel.Cleanup(tunnel.Config{
		Interface:     ifname,
		RouteTable:    table,
		RouteProtocol: proto,
		NFTable:       nftTable,
	})
	if err != nil {
		return fmt.Errorf("tunnel: %w", err)
	}
	fmt.Fprintf(stdout, "removed tunnel objects: link %s and its routes with protocol %d in table %d, nftables table ip %s\n",
		ifname, proto, table, nftTable)
	if err := fabric.Remove(fabric.Config{Table: fabricTable, RouteProtocol: proto, NFTable: fabricNFT}); err != nil {
		return fmt.Errorf("fabric: %w", err)
	}
	fmt.Fprintf(stdout, "removed fabric objects: routes with protocol %d in table %d and the rules to it, nftables table ip %s\n",
		proto, fabricTable, fabricNFT)
	return nil
}
