package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Netns is a named network namespace of the run, reachable with
// `ip netns exec <Name>`.
type Netns struct {
	env  *Env
	Name string
	Path string

	handle netns.NsHandle
	nl     *netlink.Handle
}

// newNetns creates the namespace "flotest-<run>-<suffix>" with loopback up;
// it is deleted, with every process still in it, when the test ends.
func (e *Env) newNetns(suffix string) (*Netns, error) {
	name := e.name(suffix)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("create netns %s: %v: %s", name, err, bytes.TrimSpace(out))
	}
	n := &Netns{env: e, Name: name, Path: filepath.Join("/run/netns", name)}
	e.t.Cleanup(func() {
		n.close()
		if err := deleteNetns(name); err != nil {
			e.t.Logf("harness: %v", err)
		}
	})
	h, err := netns.GetFromPath(n.Path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", name, err)
	}
	n.handle = h
	if n.nl, err = netlink.NewHandleAt(h); err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", name, err)
	}
	lo, err := n.nl.LinkByName("lo")
	if err == nil {
		err = n.nl.LinkSetUp(lo)
	}
	if err != nil {
		return nil, fmt.Errorf("loopback up in %s: %w", name, err)
	}
	return n, nil
}

func (n *Netns) close() {
	if n.nl != nil {
		n.nl.Close()
	}
	if n.handle.IsOpen() {
		n.handle.Close()
	}
}

// Netlink returns a netlink handle operating inside the namespace.
func (n *Netns) Netlink() *netlink.Handle { return n.nl }

// Handle returns the namespace's file handle.
func (n *Netns) Handle() netns.NsHandle { return n.handle }

// Exec runs a command inside the namespace and returns its combined output.
func (n *Netns) Exec(ctx context.Context, name string, args ...string) ([]byte, error) {
	argv := append([]string{"netns", "exec", n.Name, name}, args...)
	cmd := exec.CommandContext(ctx, "ip", argv...)
	cmd.Env = append(cmd.Environ(), runEnvVar+"="+n.env.RunID)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %v in %s: %w: %s", name, args, n.Name, err, bytes.TrimSpace(out))
	}
	return out, nil
}

// MustExec is Exec that fails the test on error.
func (n *Netns) MustExec(name string, args ...string) string {
	n.env.t.Helper()
	out, err := n.Exec(context.Background(), name, args...)
	if err != nil {
		n.env.fatalf("%v", err)
	}
	return string(out)
}

// Start runs argv inside the namespace until the test ends (or until the
// Process is stopped).
func (n *Netns) Start(name string, argv ...string) *Process {
	n.env.t.Helper()
	p, err := n.env.start(name, []string{"ip", "netns", "exec", n.Name}, argv)
	if err != nil {
		n.env.fatalf("start %s in %s: %v", name, n.Name, err)
	}
	return p
}

// Do runs fn on an OS thread that has entered the namespace. Sockets fn
// creates belong to the namespace and may be used from any goroutine
// afterwards; goroutines fn starts do not inherit the namespace.
func (n *Netns) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// The thread is never unlocked: it exits with the goroutine, so no
		// other goroutine can ever run in the namespace by accident.
		runtime.LockOSThread()
		if err := netns.Set(n.handle); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", n.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Listen opens a listener inside the namespace.
func (n *Netns) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() (err error) {
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// DialContext dials from inside the namespace.
func (n *Netns) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// sysctl writes a sysctl inside the namespace, e.g. "net.ipv4.ip_forward".
func (n *Netns) sysctl(key, value string) error {
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	return n.Do(func() error {
		// /proc/sys/net resolves against the opening thread's namespace.
		if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s in %s: %w", key, n.Name, err)
		}
		return nil
	})
}

// forwardFromHost listens at addr inside the namespace and relays every
// connection to the same address in the test process's own namespace. It
// stops when the test ends.
func (n *Netns) forwardFromHost(addr netip.AddrPort) error {
	l, err := n.Listen("tcp", addr.String())
	if err != nil {
		return err
	}
	f := newForwarder(l, addr.String())
	n.env.t.Cleanup(f.Close)
	return nil
}

// forwarder relays every connection accepted on a listener to one address
// dialed from the test process's own namespace, until Close, which ends
// the connections under way too and waits for its goroutines.
type forwarder struct {
	l      net.Listener
	to     string
	ctx    context.Context // canceled by Close: ends dials under way
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func newForwarder(l net.Listener, to string) *forwarder {
	f := &forwarder{l: l, to: to, conns: map[net.Conn]struct{}{}}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.wg.Add(1)
	go f.accept()
	return f
}

func (f *forwarder) accept() {
	defer f.wg.Done()
	for {
		in, err := f.l.Accept()
		if err != nil {
			return
		}
		if !f.track(in) {
			in.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.untrack(in)
			f.relay(in)
		}()
	}
}

// track records c so that Close can end it; false once closed.
func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	c.Close()
}

func (f *forwarder) relay(in net.Conn) {
	ctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
	defer cancel()
	var d net.Dialer
	out, err := d.DialContext(ctx, "tcp", f.to)
	if err != nil {
		return
	}
	if !f.track(out) {
		out.Close()
		return
	}
	defer f.untrack(out)
	done := make(chan struct{}, 2)
	go func() { io.Copy(out, in); out.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { io.Copy(in, out); in.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	<-done
	<-done
}

// Close stops accepting, ends every connection under way and waits until
// every goroutine of the forwarder has returned.
func (f *forwarder) Close() {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.cancel()
	f.l.Close()
	f.wg.Wait()
}
