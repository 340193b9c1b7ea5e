package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
)

// connectedNetworks returns the networks of the addresses on this host's
// up interfaces: the node's LANs, where a view would shadow real hosts.
// Loopback, link-local addresses and the interface skip (our WireGuard
// link, whose routes are ours) do not count.
func connectedNetworks(skip string) ([]netip.Prefix, error) {
	var links []netlink.Link
	var addrs []netlink.Addr
	var err error
	// A dump the kernel interrupts (an address changed meanwhile) may be
	// incomplete: read again; the change also sends an event.
	for range 5 {
		if links, err = netlink.LinkList(); err == nil {
			addrs, err = netlink.AddrList(nil, netlink.FAMILY_ALL)
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	counted := map[int]bool{}
	for _, l := range links {
		a := l.Attrs()
		counted[a.Index] = a.Flags&net.FlagUp != 0 && a.Flags&net.FlagLoopback == 0 && a.Name != skip
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || a.IPNet == nil || !counted[a.LinkIndex] {
			continue
		}
		ip = ip.Unmap()
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsMulticast() || ip.IsUnspecified() {
			continue
		}
		ones, bits := a.Mask.Size()
		if bits != ip.BitLen() || ones == 0 {
			continue
		}
		if p := netip.PrefixFrom(ip, ones).Masked(); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// watchHostNetworks calls changed on every address or link event of this
// host until ctx ends, and once subscribed, for what came before. A stream
// the kernel ends (ENOBUFS after a burst) is opened again.
func watchHostNetworks(ctx context.Context, log *slog.Logger, changed func()) error {
	failing := ""
	for {
		subscribed, err := watchHostNetworksOnce(ctx, changed)
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case subscribed:
			failing = ""
			log.Warn("host network events lost; subscribing again", "err", err)
		case err.Error() != failing: // a failing subscription: once, not per retry
			failing = err.Error()
			log.Error("cannot watch the host's networks; retrying every second", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// watchHostNetworksOnce watches until ctx ends or a stream ends, and
// reports whether it got as far as subscribing.
func watchHostNetworksOnce(ctx context.Context, changed func()) (bool, error) {
	var mu sync.Mutex
	var lost error
	onError := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if lost == nil {
			lost = err
		}
	}
	ended := func(what string) error {
		mu.Lock()
		defer mu.Unlock()
		if lost != nil {
			return fmt.Errorf("%s events ended: %w", what, lost)
		}
		return fmt.Errorf("%s events ended", what)
	}
	done := make(chan struct{})
	addrs := make(chan netlink.AddrUpdate, 64)
	if err := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{ErrorCallback: onError}); err != nil {
		close(done)
		return false, fmt.Errorf("subscribe to address events: %w", err)
	}
	links := make(chan netlink.LinkUpdate, 64)
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{ErrorCallback: onError}); err != nil {
		close(done)
		for range addrs {
		}
		return false, fmt.Errorf("subscribe to link events: %w", err)
	}
	// netlink's readers end when done closes their sockets; reading their
	// channels dry waits for them.
	defer func() {
		close(done)
		for range addrs {
		}
		for range links {
		}
	}()
	changed() // whatever changed before the subscription
	for {
		select {
		case <-ctx.Done():
			return true, nil
		case _, ok := <-addrs:
			if !ok {
				return true, ended("address")
			}
		case _, ok := <-links:
			if !ok {
				return true, ended("link")
			}
		}
		changed()
	}
}
