package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/flotilla-io/flotilla/agent"
)

func init() {
	register(command{name: "agent", summary: "run the agent of this cluster", run: runAgent})
}

func runAgent(ctx context.Context, args []string, _, stderr io.Writer) error {
	cfg := agent.DefaultConfig()
	fs := newFlagSet("agent", stderr)
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the local cluster (default: in-cluster service account)")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory of the agent's ledger (identity, keys, views)")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", cfg.MetricsAddr, "address serving /healthz, /readyz and /metrics (empty: off)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	logger, err := newLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "flotilla agent: %v\n", err)
		return errUsage
	}
	cfg.Logger = logger
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
