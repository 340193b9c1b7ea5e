package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/tunnel"
)

// Readiness of the tunnel: how often its device is asked, and how long an
// answer may take. Status waits while an apply holds the tunnel, so
// /readyz reports the last answer instead of waiting too.
const (
	tunnelProbeInterval = 5 * time.Second
	tunnelProbeTimeout  = 15 * time.Second
)

// startTunnel adopts or creates the WireGuard link with the key from the
// ledger and runs its repair loop and, when asked, the key rotation.
func (a *Agent) startTunnel(comps *components, ledger *ipam.Ledger, listenPort uint16) (*tunnel.Tunnel, error) {
	keyBytes, err := ledger.LoadOrCreateKey(keyWireGuard, func() ([]byte, error) {
		k, err := tunnel.GeneratePrivateKey()
		return k[:], err
	})
	if err != nil {
		return nil, fmt.Errorf("WireGuard key: %w", err)
	}
	wgKey, err := tunnel.KeyFromBytes(keyBytes)
	if err != nil {
		return nil, fmt.Errorf("WireGuard key in the ledger: %w", err)
	}
	tun, err := tunnel.New(tunnel.Config{
		Interface: a.cfg.WireGuardInterface, Mode: a.cfg.WireGuard, ListenPort: int(listenPort),
		PrivateKey: wgKey, Logger: a.log, Metrics: a.registry,
	})
	if err != nil {
		return nil, fmt.Errorf("tunnel: %w", err)
	}
	comps.OnStop("tunnel", tun.Close) // leaves the data path up for the next start
	comps.Go("tunnel repair loop", tun.Run)
	status := newProbe(func(context.Context) error {
		_, err := tun.Status() // the WireGuard device answers
		return err
	}, tunnelProbeInterval, tunnelProbeTimeout)
	comps.Go("tunnel status probe", status.run)
	a.ready.add("tunnel", status.result)
	if a.cfg.WireGuardKeyRotation > 0 {
		comps.Go("WireGuard key rotation", func(ctx context.Context) error {
			a.rotateWireGuardKey(ctx, ledger, tun, a.cfg.WireGuardKeyRotation)
			return nil
		})
	}
	return tun, nil
}

// rotateWireGuardKey replaces the WireGuard key every period: stored first,
// so a crash in between leaves the ledger and the device agreeing at the
// next start, then set on the device. The peering engine announces the new
// public key in its next statement (within a second); peers apply it, and
// traffic resumes after one handshake.
func (a *Agent) rotateWireGuardKey(ctx context.Context, ledger *ipam.Ledger, tun *tunnel.Tunnel, every time.Duration) {
	rotations := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flotilla_wireguard_key_rotations_total", Help: "WireGuard key rotations.",
	})
	a.registry.MustRegister(rotations)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		k, err := tunnel.GeneratePrivateKey()
		if err == nil {
			err = ledger.PutKey(keyWireGuard, k[:])
		}
		if err == nil {
			err = tun.SetPrivateKey(k)
		}
		if err != nil {
			a.log.Error("cannot rotate the WireGuard key", "err", err)
			continue
		}
		rotations.Inc()
		a.log.Info("WireGuard key rotated", "publicKey", k.PublicKey())
	}
}
