package tunnel_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A pod with MTU 1500 sends 1 MB over TCP to a pod behind the peer while
// the sending gateway drops every ICMP "fragmentation needed" it would
// send (as firewalls on real paths do): the WireGuard link's MTU is lower
// than the pods', so without the MSS clamp the first full-sized segment
// is dropped at the gateway, the sender never learns why and the transfer
// stalls. The receiver also reports the MSS it got in the SYN.
func TestBulkTransferWithoutPathMTUDiscovery(t *testing.T) {
	m := newMesh(t, "10.0.0.0/16", "10.0.0.0/16")
	a, b := m.sites[0], m.sites[1]
	a.exec(t, "nft", "add table ip pmtu; add chain ip pmtu out { type filter hook output priority filter; }; "+
		"add rule ip pmtu out icmp type destination-unreachable icmp code frag-needed counter drop")
	m.applyFullMesh()
	if err := pingEventually(a, b); err != nil {
		t.Fatal(err)
	}
	mtu, err := strconv.Atoi(strings.TrimSpace(a.exec(t, "cat", "/sys/class/net/"+a.ifname+"/mtu")))
	if err != nil {
		t.Fatal(err)
	}
	if podMTU := strings.TrimSpace(a.pod.MustExec("cat", "/sys/class/net/eth0/mtu")); podMTU != "1500" || mtu >= 1500 {
		t.Fatalf("want pods at MTU 1500 above a lower WireGuard MTU, got %s and %d", podMTU, mtu)
	}

	const size = 1 << 20
	l, err := b.pod.Listen("tcp", ":7071")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	mss := make(chan int, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		mss <- tcpMaxSeg(c)
		if n, err := io.CopyN(io.Discard, c, size); err == nil {
			fmt.Fprintf(c, "%d\n", n)
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := a.pod.DialContext(ctx, "tcp", netip.AddrPortFrom(a.seenFrom(b), 7071).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The deadline only tells a stall from a transfer; at the slowest
	// seen here 1 MB takes well under a second.
	c.SetDeadline(time.Now().Add(20 * time.Second))
	stalled := func(err error) {
		t.Fatalf("1 MB from pod a to pod b with ICMP frag-needed dropped: %v; MSS at the receiver %d, link MTU %d\n%s",
			err, <-mss, mtu, a.exec(t, "nft", "list", "table", "ip", "pmtu"))
	}
	if _, err := c.Write(make([]byte, size)); err != nil {
		stalled(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		stalled(err)
	}
	if strings.TrimSpace(line) != strconv.Itoa(size) {
		t.Errorf("receiver got %q bytes, want %d", line, size)
	}
	got := <-mss
	if max := mtu - 40; got > max {
		t.Errorf("MSS at the receiver %d, want at most %d (link MTU %d - 40)", got, max, mtu)
	}
	t.Logf("link MTU %d, MSS at the receiver %d", mtu, got)
}

// tcpMaxSeg is the MSS the kernel uses to send on c: at most what the
// peer announced in its SYN.
func tcpMaxSeg(c net.Conn) int {
	sc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return -1
	}
	v := -1
	sc.Control(func(fd uintptr) { v, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG) })
	return v
}
