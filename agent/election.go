package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/tunnel"
)

// errLostLease stops a replica that was active once another holds the
// Lease: it restarts as the standby. Its data path is gone by then.
var errLostLease = errors.New("another replica holds the Lease " + ha.LeaseName + "; stopping to restart as the standby")

// startElected campaigns for the Lease (--leader-elect) and starts the
// components only once this replica holds it: until then it is the
// standby, serving health and metrics, ready (its process is healthy),
// its data path absent, its ledger following the active replica's
// snapshots and the informers its network path reads listed
// (warmStandby). Once its components started, the active replica
// labels its pod (ha.RoleLabel), which the agent's Services select; a
// standby's pod carries no such label.
//
// An active replica that cannot renew the Lease keeps everything until
// another replica could hold it (ha.Elector.Run); then it is fenced: its
// data path goes (the tunnel suspended) and its label comes off, while its
// components, informers and gossip run on. If the Lease turns out to be
// still its own, the data path comes back; once another replica holds it,
// the replica stops, to restart as the standby. As it stops, it removes
// its data path before it releases the Lease.
func (a *Agent) startElected(start func(context.Context, *components) error) func(context.Context, *components) error {
	return func(ctx context.Context, comps *components) (err error) {
		// The Lease's requests go over a connection of their own: a
		// replica that has just taken over starts everything at once, and
		// on a busy node its renewals queued behind its informers' lists
		// for seconds, until it fenced itself.
		leases, err := kubeclient.NewOwnConnection(a.restCfg)
		if err != nil {
			return fmt.Errorf("kubernetes client for the Lease: %w", err)
		}
		e := &ha.Elector{
			Kube: leases, Namespace: a.agentNamespace(), Identity: ha.NewIdentity(a.cfg.NodeName),
			Log:           a.log.With("component", "leader election"),
			LeaseDuration: a.cfg.LeaseDuration, RenewDeadline: a.cfg.RenewDeadline, RetryPeriod: a.cfg.RetryPeriod,
		}
		replicas := ha.NewReplicas(a.kube, a.agentNamespace(), a.cfg.PodName, max(e.RetryPeriod, time.Second), e.Log)
		e.Others = replicas.Others
		a.registry.MustRegister(replicas.Collectors()...)
		if e.Heartbeat, err = a.heartbeat(replicas); err != nil {
			return err
		}
		comps.Go("agent replicas informer", replicas.Run)
		a.registry.MustRegister(e.Collectors()...)
		label := newRoleLabel(&ha.Role{Kube: a.kube, Namespace: a.agentNamespace(), Pod: a.cfg.PodName}, a.log, e.RetryPeriod)
		label.takeoverOn = a.cfg.NodeName
		role := atomic.Pointer[string]{}
		setRole := func(s string) { role.Store(&s) }
		setRole("standby")
		a.ready.setRole(func() string { return *role.Load() })
		active := make(chan struct{})
		// running: the components started; until then, the end of the
		// start sets the role and the label.
		var running atomic.Bool
		comps.Go("leader election", func(ctx context.Context) error {
			started := false
			err := e.Run(ctx, func(s ha.State) {
				switch {
				case s == ha.Active && !started:
					started = true
					close(active)
				case s == ha.Active:
					a.unfenceDataPath()
					if running.Load() {
						setRole("active")
						label.set(true)
					}
				case s == ha.Fenced:
					a.fenceDataPath()
					setRole("fenced")
					label.set(false)
				}
			})
			if err == nil && ctx.Err() == nil {
				err = errLostLease
			}
			return err
		})
		comps.Go("gateway role label", label.run)
		if err := a.startWarm(ctx, comps); err != nil {
			return err
		}
		a.log.Info("standby: waiting for the Lease", "lease", a.agentNamespace()+"/"+ha.LeaseName, "identity", e.Identity)
		stopFollowing := a.followLedger(ctx)
		select {
		case <-active:
		case <-ctx.Done():
			stopFollowing()
			return context.Cause(ctx)
		}
		// The ledger is the active replica's to open from now on.
		stopFollowing()
		setRole("active, starting")
		if err := start(ctx, comps); err != nil {
			return err
		}
		running.Store(true)
		if !a.fenced.Load() {
			setRole("active")
			label.set(true)
		}
		return nil
	}
}

// followLedger has a standby's ledger follow the snapshots the active
// replica writes (ha.Snapshots.Follow), so that a takeover finds it
// restored; the function returned stops it and waits until the ledger
// is closed.
func (a *Agent) followLedger(ctx context.Context) (stop func()) {
	snaps := a.ledgerSnapshots()
	if snaps == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		snaps.Follow(ctx, func() (*ipam.Ledger, error) {
			return ipam.Open(filepath.Join(a.cfg.StateDir, ipam.FileName), ipam.Options{Now: a.now})
		}, keyIdentity)
	}()
	return func() { cancel(); <-done }
}

// heartbeat is the replicas' heartbeat (ha.Heartbeat) on HeartbeatPort,
// or nil: none configured, or the agent does not run in a pod (its
// replicas are then no pods to find).
func (a *Agent) heartbeat(replicas *ha.Replicas) (*ha.Heartbeat, error) {
	if a.cfg.HeartbeatPort == 0 || a.cfg.PodName == "" {
		return nil, nil
	}
	if a.cfg.HeartbeatPort < 0 || a.cfg.HeartbeatPort > 65535 {
		return nil, fmt.Errorf("--heartbeat-port %d: not a port", a.cfg.HeartbeatPort)
	}
	port := uint16(a.cfg.HeartbeatPort)
	at := netip.AddrPortFrom(netip.IPv4Unspecified(), port)
	if a.cfg.NodeAddress.IsValid() {
		at = netip.AddrPortFrom(a.cfg.NodeAddress, port)
	}
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(at))
	if err != nil {
		return nil, fmt.Errorf("listen for the replicas' heartbeat on %s (--heartbeat-port): %w", at, err)
	}
	return &ha.Heartbeat{Conn: conn, Peers: replicas.Addrs(port)}, nil
}

// startAlone starts the one replica there is (no --leader-elect): it is
// the active one, and labels its pod so once its components started.
func (a *Agent) startAlone(start func(context.Context, *components) error) func(context.Context, *components) error {
	return func(ctx context.Context, comps *components) error {
		if err := start(ctx, comps); err != nil {
			return err
		}
		label := newRoleLabel(&ha.Role{Kube: a.kube, Namespace: a.agentNamespace(), Pod: a.cfg.PodName}, a.log, 0)
		label.set(true)
		comps.Go("gateway role label", label.run)
		return nil
	}
}

// roleLabel keeps this replica's pod labelled as its role: active once
// its components started, otherwise without the label. A write the API
// server refused is retried; the last one left when the agent stops is
// the label's removal.
type roleLabel struct {
	role  *ha.Role
	log   *slog.Logger
	retry time.Duration
	// takeoverOn, when set, is this replica's node: elected replicas
	// record an Event on their pod once labelled active.
	takeoverOn string

	active  atomic.Bool
	changed chan struct{}
}

func newRoleLabel(role *ha.Role, log *slog.Logger, retry time.Duration) *roleLabel {
	if retry <= 0 {
		retry = ha.DefaultRetryPeriod
	}
	return &roleLabel{role: role, log: log.With("component", "gateway role label", "pod", role.Namespace+"/"+role.Pod), retry: retry, changed: make(chan struct{}, 1)}
}

func (r *roleLabel) set(active bool) {
	r.active.Store(active)
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *roleLabel) run(ctx context.Context) error {
	if r.role.Pod == "" {
		<-ctx.Done() // not in a pod: no label to write
		return nil
	}
	var (
		written *bool // the role last written; nil: none yet
		lastErr string
	)
	for {
		if want := r.active.Load(); written == nil || *written != want {
			err := r.write(ctx, want)
			switch {
			case err == nil:
				written = &want
				lastErr = ""
				r.log.Info("pod labelled with its role", "active", want)
				if want && r.takeoverOn != "" {
					r.recordTakeover(ctx)
				}
			case ctx.Err() == nil && err.Error() != lastErr:
				lastErr = err.Error()
				r.log.Warn("role label not written; retrying", "err", err)
			}
		}
		var retry <-chan time.Time
		if written == nil || *written != r.active.Load() {
			retry = time.After(r.retry)
		}
		select {
		case <-ctx.Done():
			if written == nil || *written {
				// A stopping replica leaves no label for a Service to follow.
				sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				if err := r.role.MarkStandby(sctx); err != nil {
					r.log.Warn("role label not removed as the agent stops; the next active replica removes it", "err", err)
				}
			}
			return nil
		case <-r.changed:
		case <-retry:
		}
	}
}

// recordTakeover writes the takeover's Event; one not written is logged,
// the label and the metrics still say which replica is active.
func (r *roleLabel) recordTakeover(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.role.RecordTakeover(ctx, r.takeoverOn, time.Now()); err != nil {
		r.log.Warn("takeover event not recorded", "err", err)
	}
}

func (r *roleLabel) write(ctx context.Context, active bool) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if active {
		return r.role.MarkActive(ctx)
	}
	return r.role.MarkStandby(ctx)
}

// adoptTunnel makes tun the data path a fence removes: made while this
// replica is fenced (a start under way), it goes at once.
func (a *Agent) adoptTunnel(tun *tunnel.Tunnel) error {
	a.dataPathMu.Lock()
	defer a.dataPathMu.Unlock()
	a.traced.Store(tun)
	if a.fenced.Load() {
		return tun.Suspend()
	}
	return nil
}

// fenceDataPath removes the WireGuard link, its routes and our nftables
// tables, and keeps them away until unfenceDataPath: another replica may
// be the active one.
func (a *Agent) fenceDataPath() {
	a.dataPathMu.Lock()
	defer a.dataPathMu.Unlock()
	a.fenced.Store(true)
	if tun := a.traced.Load(); tun != nil {
		if err := tun.Suspend(); err != nil {
			a.log.Error("data path of a fenced replica not removed", "err", err)
			return
		}
		a.log.Info("data path removed: this replica is not the active one", "interface", a.cfg.WireGuardInterface)
	}
}

// unfenceDataPath brings the data path back: the Lease is this replica's
// again.
func (a *Agent) unfenceDataPath() {
	a.dataPathMu.Lock()
	defer a.dataPathMu.Unlock()
	a.fenced.Store(false)
	if tun := a.traced.Load(); tun != nil {
		if err := tun.Resume(); err != nil {
			a.log.Error("data path not brought back", "err", err)
			return
		}
		a.log.Info("data path back: this replica holds the Lease again", "interface", a.cfg.WireGuardInterface)
	}
}

// removeFencedDataPath removes the WireGuard link, its routes and our
// nftables table once a fenced replica's components have stopped: the
// active replica runs the data path now.
func (a *Agent) removeFencedDataPath() error {
	if !a.fenced.Load() || a.traced.Load() == nil {
		return nil // not fenced, or fenced before it brought a data path up
	}
	if err := tunnel.Cleanup(tunnel.Config{Interface: a.cfg.WireGuardInterface}); err != nil {
		return fmt.Errorf("remove the data path of a fenced replica: %w", err)
	}
	a.log.Info("data path removed: another replica is active", "interface", a.cfg.WireGuardInterface)
	return nil
}
