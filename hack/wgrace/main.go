// Command wgrace measures what happens when two wireguard-go devices add
// each other at the same moment, as two Flotilla gateways do when they
// peer, with each first-contact strategy:
//
//	both   both sides add the peer with its persistent keepalive, so both
//	       initiate a handshake at once;
//	one    the side with the larger public key adds the peer without its
//	       keepalive and initiates only if nothing arrived from the peer
//	       within -wait (what tunnel/firstcontact.go does).
//
// Each round creates two devices on loopback UDP, configures them up to
// -offset apart, waits until both report a handshake, then sends one
// packet each way. A direction that carries nothing within a second is a
// failure; the program reports how long it stayed broken.
//
//	go run ./hack/wgrace -strategy both -rounds 300 -offset 5ms
//	go run ./hack/wgrace -strategy one -rounds 300 -offset 5ms
package main

import (
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun/tuntest"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

var (
	strategy = flag.String("strategy", "one", "first-contact strategy: both or one")
	rounds   = flag.Int("rounds", 300, "number of first contacts")
	offset   = flag.Duration("offset", 5*time.Millisecond, "the two sides configure up to this far apart, either way")
	wait     = flag.Duration("wait", 100*time.Millisecond, "strategy one: how long the waiting side waits before it initiates")
	basePort = flag.Int("port", 41000, "first UDP port on loopback; each round uses two")
)

type side struct {
	tun  *tuntest.ChannelTUN
	dev  *device.Device
	key  wgtypes.Key
	port int
	ip   netip.Addr
}

func main() {
	flag.Parse()
	if *strategy != "both" && *strategy != "one" {
		fmt.Fprintln(os.Stderr, "wgrace: -strategy must be both or one")
		os.Exit(2)
	}
	var failures []string
	var times []time.Duration
	for i := range *rounds {
		took, broken, err := round(i)
		if err != nil {
			fmt.Fprintf(os.Stderr, "wgrace: round %d: %v\n", i, err)
			os.Exit(1)
		}
		times = append(times, took)
		if broken != "" {
			failures = append(failures, broken)
		}
	}
	slices.Sort(times)
	n := len(times)
	fmt.Printf("strategy %s, %d rounds, offset up to %s: %d with a broken direction", *strategy, n, *offset, len(failures))
	if len(failures) > 0 {
		fmt.Printf(" (%s)", strings.Join(failures, "; "))
	}
	fmt.Printf("\ntime from the later configuration to a handshake on both sides: median %s, p90 %s, max %s\n",
		times[n/2].Round(time.Microsecond), times[n*9/10].Round(time.Microsecond), times[n-1].Round(time.Microsecond))
}

// round runs one first contact. It returns the time from the later of
// the two configurations to a handshake on both sides, and a description
// of a broken direction, if any.
func round(i int) (time.Duration, string, error) {
	quiet := &device.Logger{Verbosef: device.DiscardLogf, Errorf: device.DiscardLogf}
	var s [2]*side
	for j := range s {
		k, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			return 0, "", err
		}
		t := tuntest.NewChannelTUN()
		d := device.NewDevice(t.TUN(), conn.NewDefaultBind(), quiet)
		defer d.Close()
		port := *basePort + (i%1000)*2 + j
		if err := d.IpcSet(fmt.Sprintf("private_key=%s\nlisten_port=%d\n", hex.EncodeToString(k[:]), port)); err != nil {
			return 0, "", err
		}
		if err := d.Up(); err != nil {
			return 0, "", err
		}
		s[j] = &side{tun: t, dev: d, key: k, port: port, ip: netip.AddrFrom4([4]byte{10, 9, 0, byte(j + 1)})}
	}
	// Side j sleeps delay[j] before configuring: one of them up to
	// -offset later than the other.
	var delay [2]time.Duration
	if *offset > 0 {
		d := time.Duration(rand.Int64N(int64(2**offset))) - *offset
		if d > 0 {
			delay[1] = d
		} else {
			delay[0] = -d
		}
	}
	var configured [2]time.Time
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for j := range s {
		me, o := s[j], s[1-j]
		pub, myPub := o.key.PublicKey(), me.key.PublicKey()
		waits := *strategy == "one" && bytes.Compare(myPub[:], pub[:]) > 0
		ka := 25
		if waits {
			ka = 0
		}
		cfg := fmt.Sprintf("public_key=%s\nendpoint=127.0.0.1:%d\npersistent_keepalive_interval=%d\nallowed_ip=%s/32\n",
			hex.EncodeToString(pub[:]), o.port, ka, o.ip)
		wg.Add(1)
		go func() {
			time.Sleep(delay[j])
			err := me.dev.IpcSet(cfg)
			configured[j] = time.Now()
			wg.Done()
			if err != nil {
				errs <- err
				return
			}
			if !waits {
				return
			}
			time.Sleep(*wait)
			if st, _ := me.dev.IpcGet(); !strings.Contains(st, "\nrx_bytes=0\n") {
				return // the other side's initiation arrived
			}
			if err := me.dev.IpcSet(fmt.Sprintf("public_key=%s\nupdate_only=true\npersistent_keepalive_interval=25\n", hex.EncodeToString(pub[:]))); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	later := configured[0]
	if configured[1].After(later) {
		later = configured[1]
	}
	deadline := time.Now().Add(30 * time.Second)
	for !handshaken(s[0]) || !handshaken(s[1]) {
		select {
		case err := <-errs:
			return 0, "", err
		default:
		}
		if time.Now().After(deadline) {
			return 0, "", fmt.Errorf("no handshake after 30 s")
		}
		time.Sleep(time.Millisecond)
	}
	took := time.Since(later)
	for j := range s {
		me, o := s[j], s[1-j]
		if broken := brokenFor(me, o); broken > 0 {
			return took, fmt.Sprintf("round %d: %d->%d carried nothing for %s", i, j, 1-j, broken.Round(100*time.Millisecond)), nil
		}
	}
	return took, "", nil
}

// brokenFor sends a packet from me to o and, if none arrives within a
// second, keeps sending until one does; it returns how long that took
// (0: the first arrived).
func brokenFor(me, o *side) time.Duration {
	drain(o)
	me.tun.Outbound <- tuntest.Ping(o.ip, me.ip)
	select {
	case <-o.tun.Inbound:
		return 0
	case <-time.After(time.Second):
	}
	start := time.Now().Add(-time.Second)
	for time.Since(start) < 60*time.Second {
		me.tun.Outbound <- tuntest.Ping(o.ip, me.ip)
		select {
		case <-o.tun.Inbound:
			return time.Since(start)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return time.Since(start)
}

func drain(s *side) {
	for {
		select {
		case <-s.tun.Inbound:
		default:
			return
		}
	}
}

func handshaken(s *side) bool {
	st, err := s.dev.IpcGet()
	return err == nil && strings.Contains(st, "\nlast_handshake_time_sec=") && !strings.Contains(st, "\nlast_handshake_time_sec=0\n")
}
