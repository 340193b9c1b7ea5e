package tunnel

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/ipc"
	"golang.zx2c4.com/wireguard/tun"
)

// Mode selects the WireGuard implementation.
type Mode string

const (
	// ModeAuto uses kernel WireGuard when the kernel can create a
	// wireguard link, the embedded userspace device otherwise. An existing
	// link of ours is adopted in whatever mode it was made.
	ModeAuto Mode = "auto"
	// ModeKernel requires kernel WireGuard.
	ModeKernel Mode = "kernel"
	// ModeUserspace runs wireguard-go inside this process behind a TUN.
	ModeUserspace Mode = "userspace"
)

// ParseMode reads a --wireguard flag value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeKernel, ModeUserspace:
		return m, nil
	}
	return "", fmt.Errorf("wireguard mode %q: want auto, kernel or userspace", s)
}

// linkAlias tags the WireGuard link as ours; a link of the configured name
// without it is never adopted, changed or deleted.
const linkAlias = "flotilla-tunnel"

// uapiDir is where wireguard-go and wg(8) meet; one socket per interface
// name for the whole host.
const uapiDir = "/var/run/wireguard"

// wgLink is the WireGuard interface: a kernel link, or a persistent TUN with
// the userspace device serving it from this process.
type wgLink struct {
	name   string
	kernel bool

	dev  *device.Device // userspace only
	uapi net.Listener   // userspace only
}

// openLink adopts the link of ours with the given name, or creates it.
func openLink(name string, mode Mode, mtu int, log *slog.Logger) (*wgLink, error) {
	existing, err := netlink.LinkByName(name)
	switch {
	case err == nil:
		if existing.Attrs().Alias != linkAlias {
			return nil, fmt.Errorf("link %s exists and is not ours (alias %q, want %q); choose another interface name or remove it",
				name, existing.Attrs().Alias, linkAlias)
		}
		switch existing.Type() {
		case "wireguard":
			if mode == ModeUserspace {
				return nil, fmt.Errorf("link %s is a kernel WireGuard link but userspace mode was asked for; run 'flotilla cleanup' first", name)
			}
			log.Info("adopting kernel wireguard link", "link", name)
			return &wgLink{name: name, kernel: true}, nil
		case "tuntap":
			if mode == ModeKernel {
				return nil, fmt.Errorf("link %s is a userspace WireGuard TUN but kernel mode was asked for; run 'flotilla cleanup' first", name)
			}
			log.Info("adopting userspace wireguard link", "link", name)
			return openUserspace(name, mtu, log)
		default:
			return nil, fmt.Errorf("link %s has type %s, want wireguard or tuntap; run 'flotilla cleanup'", name, existing.Type())
		}
	case !errors.As(err, new(netlink.LinkNotFoundError)):
		return nil, fmt.Errorf("look up link %s: %w", name, err)
	}

	if mode == ModeKernel || mode == ModeAuto {
		kerr := netlink.LinkAdd(&netlink.Wireguard{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu}})
		if kerr == nil {
			log.Info("created kernel wireguard link", "link", name)
			return &wgLink{name: name, kernel: true}, tagLink(name)
		}
		if mode == ModeKernel {
			return nil, fmt.Errorf("create kernel wireguard link %s: %w (no wireguard module? try --wireguard=userspace)", name, kerr)
		}
		log.Info("kernel wireguard unavailable, using the embedded userspace device", "link", name, "reason", kerr)
	}
	return openUserspace(name, mtu, log)
}

func tagLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("look up link %s: %w", name, err)
	}
	if err := netlink.LinkSetAlias(l, linkAlias); err != nil {
		return fmt.Errorf("tag link %s: %w", name, err)
	}
	return nil
}

// openUserspace creates (or attaches to) a persistent TUN and serves it
// with wireguard-go and a UAPI socket that wgctrl and wg(8) talk to. The
// TUN is made persistent so the link, its routes and the NAT survive a
// restart of this process: the next process attaches to it again.
func openUserspace(name string, mtu int, log *slog.Logger) (*wgLink, error) {
	tdev, err := tun.CreateTUN(name, mtu)
	if err != nil {
		return nil, fmt.Errorf("create tun %s: %w", name, err)
	}
	if err := setPersist(tdev, true); err != nil {
		tdev.Close()
		return nil, err
	}
	if err := tagLink(name); err != nil {
		tdev.Close()
		return nil, err
	}
	wlog := &device.Logger{
		Verbosef: func(format string, args ...any) { log.Debug(fmt.Sprintf(format, args...), "link", name) },
		Errorf:   func(format string, args ...any) { log.Warn(fmt.Sprintf(format, args...), "link", name) },
	}
	// Batches of deviceBatch keep wireguard-go's buffers off the Go
	// heap's account (batch.go).
	btun, err := newBatchedTUN(tdev, deviceBatch)
	if err != nil {
		tdev.Close()
		return nil, err
	}
	dev := device.NewDevice(btun, newBatchedBind(conn.NewDefaultBind(), deviceBatch), wlog)
	f, err := ipc.UAPIOpen(name)
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("open wireguard control socket for %s: %w", name, err)
	}
	uapi, err := ipc.UAPIListen(name, f)
	f.Close()
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("listen on wireguard control socket for %s: %w", name, err)
	}
	go func() {
		for {
			c, err := uapi.Accept()
			if err != nil {
				return
			}
			go dev.IpcHandle(c)
		}
	}()
	return &wgLink{name: name, dev: dev, uapi: uapi}, nil
}

func setPersist(tdev tun.Device, on bool) error {
	nt, ok := tdev.(*tun.NativeTun)
	if !ok {
		return fmt.Errorf("tun device %T cannot be made persistent", tdev)
	}
	sc, err := nt.File().SyscallConn()
	if err != nil {
		return fmt.Errorf("make tun persistent: %w", err)
	}
	v := 0
	if on {
		v = 1
	}
	var ierr error
	if err := sc.Control(func(fd uintptr) { ierr = unix.IoctlSetInt(int(fd), unix.TUNSETPERSIST, v) }); err != nil {
		return fmt.Errorf("make tun persistent: %w", err)
	}
	if ierr != nil {
		return fmt.Errorf("make tun persistent: %w", ierr)
	}
	return nil
}

// close stops serving the link from this process and leaves the link, its
// routes and its NAT in place. Kernel WireGuard keeps forwarding; a
// userspace TUN drops packets until the next process attaches.
func (l *wgLink) close() {
	if l.dev == nil {
		return
	}
	l.uapi.Close()
	l.dev.Close()
	// The listener does not unlink its socket; leave no stale file behind.
	os.Remove(filepath.Join(uapiDir, l.name+".sock"))
	l.dev = nil
}

// ourLink looks up the link of that name and reports whether it is ours;
// a missing link is not an error.
func ourLink(name string) (netlink.Link, bool, error) {
	l, err := netlink.LinkByName(name)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("look up link %s: %w", name, err)
	}
	return l, l.Attrs().Alias == linkAlias, nil
}

// removeLink deletes the link of ours with that name, if any, and its
// control socket.
func removeLink(name string) error {
	l, err := netlink.LinkByName(name)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return removeSocket(name)
	}
	if err != nil {
		return fmt.Errorf("look up link %s: %w", name, err)
	}
	if l.Attrs().Alias != linkAlias {
		return fmt.Errorf("link %s is not ours (alias %q); left alone", name, l.Attrs().Alias)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	return removeSocket(name)
}

func removeSocket(name string) error {
	p := filepath.Join(uapiDir, name+".sock")
	// A socket someone still answers on belongs to a running device; leave it.
	if c, err := net.Dial("unix", p); err == nil {
		c.Close()
		return nil
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove control socket %s: %w", p, err)
	}
	return nil
}
