package e2e

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/tunnel"
)

// swarmConfig is what the test binary, run as "swarm" inside a site,
// needs to play Peers members of the federation that peer with one
// cluster (the hub) and nothing else.
type swarmConfig struct {
	Token string
	// Advertise is the site's address: every member gossips on
	// GossipPort+i and runs WireGuard on WireGuardPort+i there.
	Advertise                 netip.Addr
	GossipPort, WireGuardPort uint16
	// Hub is the gossip address of the one cluster each member peers
	// with; it is also the seed every member joins.
	Hub   netip.AddrPort
	Peers int
	// Network is what every member announces as its pod network: the
	// same for all, so the hub remaps each into a view of its own.
	Network netip.Prefix
	Dir     string
}

// runSwarm plays cfg.Peers clusters without Kubernetes: each a real
// discovery member (gossip with the federation key, a signed record), a
// real peering engine with its own identity and ledger, and a WireGuard
// device of wireguard-go that answers handshakes but carries no traffic
// (its TUN is a sink), so that the hub's tunnel to it comes up and its
// Peer reaches Connected as with a real cluster. Each engine hears only
// of the hub: the members do not peer with each other (99 x 98
// negotiations would measure this process, not the hub). It runs until
// SIGTERM.
func runSwarm(configFile string) error {
	raw, err := os.ReadFile(configFile)
	if err != nil {
		return err
	}
	var cfg swarmConfig
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("%s: %w", configFile, err)
	}
	tok, err := discovery.ParseFederationKey(cfg.Token)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var wg sync.WaitGroup
	errs := make(chan error, cfg.Peers)
	for i := range cfg.Peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := runSwarmMember(ctx, cfg, tok.Key, i, log.With("member", i)); err != nil {
				errs <- fmt.Errorf("member %d: %w", i, err)
			}
		}()
	}
	fmt.Printf("swarm: %d members started\n", cfg.Peers)
	select {
	case err := <-errs:
		stop()
		wg.Wait()
		return err
	case <-ctx.Done():
	}
	wg.Wait()
	return nil
}

// runSwarmMember runs member i until ctx ends.
func runSwarmMember(ctx context.Context, cfg swarmConfig, key []byte, i int, log *slog.Logger) error {
	id, err := identity.Generate()
	if err != nil {
		return err
	}
	ledger, err := ipam.Open(filepath.Join(cfg.Dir, strconv.Itoa(i), ipam.FileName), ipam.Options{})
	if err != nil {
		return err
	}
	defer ledger.Close()
	// As the agent records its pod network: the views peers claim of it
	// are checked against it.
	if _, err := ledger.SetLocalNetworks([]ipam.LocalNetwork{{Range: cfg.Network, Kind: ipam.PodNetwork}}); err != nil {
		return err
	}
	wgPort := int(cfg.WireGuardPort) + i
	dp, err := newSinkTunnel(wgPort)
	if err != nil {
		return err
	}
	defer dp.close()

	var engine atomic.Pointer[peering.Engine]
	gossip := netip.AddrPortFrom(cfg.Advertise, cfg.GossipPort+uint16(i))
	endpoint := netip.AddrPortFrom(cfg.Advertise, uint16(wgPort))
	disc, err := discovery.New(discovery.Config{
		Identity: id, Keys: [][]byte{key}, Protocol: peering.ProtocolVersion,
		BindAddr: gossip, AdvertiseAddr: gossip, Endpoint: endpoint.String(),
		Seeds: []string{cfg.Hub.String()},
		OnMessage: func(msg []byte) {
			if e := engine.Load(); e != nil {
				e.Receive(msg)
			}
		},
		Serials: ledger, Logger: log,
	})
	if err != nil {
		return err
	}
	eng, err := peering.New(peering.Config{
		Identity: id, Name: fmt.Sprintf("swarm-%03d", i), Policy: peering.PolicyAuto,
		Networks: []netip.Prefix{cfg.Network}, Endpoint: endpoint,
		Ledger: ledger, Dataplane: dp, Transport: disc, Logger: log,
	})
	if err != nil {
		return err
	}
	engine.Store(eng)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- eng.Run(ctx) }()
	<-eng.Ready()
	if err := disc.Start(ctx); err != nil {
		return err
	}
	defer disc.Close()
	for ev := range disc.Subscribe(ctx) {
		if ev.Member.Gossip != cfg.Hub {
			continue // the hub is the only peer
		}
		eng.MemberChanged(peering.Member{
			ClusterID: ev.Member.ClusterID, PublicKey: ev.Member.Record.PublicKey, Gossip: ev.Member.Gossip.String(),
			Alive: ev.Kind == discovery.Join || ev.Kind == discovery.Update, Sources: []string{"seed"},
		})
	}
	cancel()
	return <-done
}

// sinkTunnel is a swarm member's data path: a wireguard-go device on a
// UDP port, configured with the peers the engine asks for, whose TUN
// swallows everything. Handshakes and keepalives are real; no route, no
// NAT, no interface.
type sinkTunnel struct {
	dev  *device.Device
	priv tunnel.Key

	mu    sync.Mutex
	peers map[tunnel.Key]string // public key -> cluster ID
}

func newSinkTunnel(port int) (*sinkTunnel, error) {
	priv, err := tunnel.GeneratePrivateKey()
	if err != nil {
		return nil, err
	}
	dev := device.NewDevice(newSinkTUN(), conn.NewStdNetBind(), device.NewLogger(device.LogLevelSilent, ""))
	if err := dev.IpcSet(fmt.Sprintf("private_key=%s\nlisten_port=%d\n", hex.EncodeToString(priv[:]), port)); err != nil {
		dev.Close()
		return nil, fmt.Errorf("configure WireGuard on port %d: %w", port, err)
	}
	if err := dev.Up(); err != nil {
		dev.Close()
		return nil, fmt.Errorf("WireGuard up on port %d: %w", port, err)
	}
	return &sinkTunnel{dev: dev, priv: priv, peers: map[tunnel.Key]string{}}, nil
}

func (s *sinkTunnel) close() { s.dev.Close() }

func (s *sinkTunnel) PublicKey() tunnel.Key { return s.priv.PublicKey() }

// Apply sets the device's peers to d's: key, endpoint, keepalive and the
// views as allowed IPs. Peers that stay are updated in place, keeping
// their session. Every peer initiates at once (the swarm has no
// first-contact wait: a crossed first handshake only delays it).
func (s *sinkTunnel) Apply(_ context.Context, d tunnel.Desired) error {
	var b strings.Builder
	peers := map[tunnel.Key]string{}
	for _, p := range d.Peers {
		peers[p.PublicKey] = p.ClusterID
		fmt.Fprintf(&b, "public_key=%s\n", hex.EncodeToString(p.PublicKey[:]))
		if p.Endpoint.IsValid() {
			fmt.Fprintf(&b, "endpoint=%s\n", p.Endpoint)
		}
		fmt.Fprintf(&b, "persistent_keepalive_interval=%d\nreplace_allowed_ips=true\n", int(p.Keepalive.Seconds()))
		for _, v := range p.Views {
			fmt.Fprintf(&b, "allowed_ip=%s\n", v.As)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for key := range s.peers {
		if _, ok := peers[key]; !ok {
			fmt.Fprintf(&b, "public_key=%s\nremove=true\n", hex.EncodeToString(key[:]))
		}
	}
	if err := s.dev.IpcSet(b.String()); err != nil {
		return fmt.Errorf("configure %d WireGuard peers: %w", len(d.Peers), err)
	}
	s.peers = peers
	return nil
}

// Status reads the handshakes back from the device.
func (s *sinkTunnel) Status() ([]tunnel.PeerStatus, error) {
	raw, err := s.dev.IpcGet()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []tunnel.PeerStatus
	var cur *tunnel.PeerStatus
	for _, line := range strings.Split(raw, "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		switch k {
		case "public_key":
			b, err := hex.DecodeString(v)
			if err != nil {
				return nil, fmt.Errorf("WireGuard status: public key %q: %w", v, err)
			}
			key, err := tunnel.KeyFromBytes(b)
			if err != nil {
				return nil, err
			}
			out = append(out, tunnel.PeerStatus{ClusterID: s.peers[key], PublicKey: key})
			cur = &out[len(out)-1]
		case "last_handshake_time_sec":
			if sec, _ := strconv.ParseInt(v, 10, 64); cur != nil && sec > 0 {
				cur.LastHandshake = time.Unix(sec, 0)
			}
		case "endpoint":
			if cur != nil {
				cur.Endpoint, _ = netip.ParseAddrPort(v)
			}
		}
	}
	return out, nil
}

// sinkTUN is a TUN device that never yields a packet and drops every one
// written to it.
type sinkTUN struct {
	events chan tun.Event
	closed chan struct{}
	once   sync.Once
}

func newSinkTUN() *sinkTUN {
	t := &sinkTUN{events: make(chan tun.Event, 1), closed: make(chan struct{})}
	t.events <- tun.EventUp
	return t
}

func (t *sinkTUN) File() *os.File { return nil }

func (t *sinkTUN) Read([][]byte, []int, int) (int, error) {
	<-t.closed
	return 0, os.ErrClosed
}

func (t *sinkTUN) Write(bufs [][]byte, _ int) (int, error) { return len(bufs), nil }
func (t *sinkTUN) MTU() (int, error)                       { return 1420, nil }
func (t *sinkTUN) Name() (string, error)                   { return "sink", nil }
func (t *sinkTUN) Events() <-chan tun.Event                { return t.events }
func (t *sinkTUN) BatchSize() int                          { return 1 }

func (t *sinkTUN) Close() error {
	t.once.Do(func() { close(t.closed); close(t.events) })
	return nil
}
