package fabric

import (
	"context"
	"log/slog"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
)

type Role string

const (
	Worker  Role = "worker"
	Gateway Role = "gateway"
)

type Node struct {
	Addr     netip.Addr
	PodCIDRs []netip.Prefix
}

type Desired struct {
	Role            Role
	Gateway         netip.Addr
	Views           []netip.Prefix
	MTU             int
	Nodes           []Node
	TunnelInterface string
}

type Config struct {
	Logger  *slog.Logger
	Metrics prometheus.Registerer
}

type Fabric struct{}

func New(cfg Config) (*Fabric, error)           { return &Fabric{}, nil }
func (f *Fabric) Apply(d Desired) error         { return nil }
func (f *Fabric) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func Remove(cfg Config) error                   { return nil }
