package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
)

func init() { register(newVerifyPodCommand) }

// verifyPort is where a verify server pod answers HTTP.
const verifyPort = 8080

// newVerifyPodCommand is what the pods `flotilla verify` runs execute,
// from the agent's image: a server that names itself, and a prober.
func newVerifyPodCommand() *cobra.Command {
	serve := &cobra.Command{
		Use:   "serve",
		Short: "answer GET / with this pod's name and the caller's address",
		Args:  noArgs,
	}
	serve.RunE = func(cmd *cobra.Command, _ []string) error {
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", verifyPort))
		if err != nil {
			return err
		}
		return serveVerify(cmd.Context(), cmd.OutOrStdout(), l)
	}
	probe := &cobra.Command{
		Use:   "probe NAME=URL=POD...",
		Short: "GET each URL until the pod POD answers or --for passes; print one JSON line per check",
		Args:  cobra.MinimumNArgs(1),
	}
	within := probe.Flags().Duration("for", time.Minute, "how long each URL is tried")
	probe.RunE = func(cmd *cobra.Command, args []string) error {
		targets := make([]probeTarget, len(args))
		for i, a := range args {
			t, err := parseProbeTarget(a)
			if err != nil {
				return usageErrorf("%v", err)
			}
			targets[i] = t
		}
		runProbes(cmd.Context(), cmd.OutOrStdout(), targets, *within)
		return nil
	}
	return withVerbs(&cobra.Command{
		Use:    "verify-pod",
		Short:  "what the pods of `flotilla verify` run",
		Hidden: true,
	}, serve, probe)
}

// serveVerify answers every GET with "host <pod>\npeer <caller>\n", as
// the probe checks it, until ctx ends.
func serveVerify(ctx context.Context, out io.Writer, l net.Listener) error {
	host, err := os.Hostname()
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			peer, _, _ := net.SplitHostPort(r.RemoteAddr)
			fmt.Fprintf(w, "host %s\npeer %s\n", host, peer)
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	fmt.Fprintf(out, "%s %s on %s\n", verifyServingLine, host, l.Addr())
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// verifyServingLine starts the line a server writes once it listens:
// what the logs check reads back through the virtual node.
const verifyServingLine = "flotilla verify: serving"

// probeTarget is one check a probe pod makes: GET URL, answered by the
// pod Pod.
type probeTarget struct {
	Name, URL, Pod string
}

// String is the probe's argument: NAME=URL=POD.
func (t probeTarget) String() string { return t.Name + "=" + t.URL + "=" + t.Pod }

func parseProbeTarget(s string) (probeTarget, error) {
	name, rest, ok1 := strings.Cut(s, "=")
	i := strings.LastIndex(rest, "=")
	if !ok1 || i < 0 || name == "" || rest[:i] == "" || rest[i+1:] == "" {
		return probeTarget{}, fmt.Errorf("probe %q: want NAME=URL=POD", s)
	}
	return probeTarget{Name: name, URL: rest[:i], Pod: rest[i+1:]}, nil
}

// probeResult is one line a probe prints: what the CLI reads from its
// log.
type probeResult struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// runProbes tries every target at once, each until it passes or within
// passes, and prints each outcome as it comes.
func runProbes(ctx context.Context, out io.Writer, targets []probeTarget, within time.Duration) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := probeUntil(ctx, t, within)
			line, _ := json.Marshal(r)
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(out, "%s\n", line)
		}()
	}
	wg.Wait()
}

func probeUntil(ctx context.Context, t probeTarget, within time.Duration) probeResult {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	var last error
	for {
		host, peer, err := getOnce(ctx, client, t.URL)
		switch {
		case err != nil && ctx.Err() != nil && last != nil:
			// The deadline cut this attempt short; what the attempts
			// before it saw says more than "deadline exceeded".
		case err != nil:
			last = err
		case host != t.Pod:
			last = fmt.Errorf("answered by %s, not %s", host, t.Pod)
		default:
			return probeResult{Name: t.Name, OK: true, Detail: fmt.Sprintf("%s answered in %s, saw the caller as %s", t.Pod, time.Since(start).Round(time.Millisecond), peer)}
		}
		select {
		case <-ctx.Done():
			return probeResult{Name: t.Name, Detail: fmt.Sprintf("GET %s: no answer from %s within %s: %v", t.URL, t.Pod, within.Round(time.Second), last)}
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// getOnce GETs url and reads the server's "host" and "peer" lines.
func getOnce(ctx context.Context, client *http.Client, url string) (host, peer string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return "", "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("status %s", resp.Status)
	}
	if _, err := fmt.Sscanf(string(body), "host %s\npeer %s\n", &host, &peer); err != nil {
		return "", "", fmt.Errorf("answer %q is not a verify server's", body)
	}
	return host, peer, nil
}

// parseProbeOutput reads a probe pod's log: one result per line, and
// the lines that are not one (which say why the probe did not run).
func parseProbeOutput(log string) (map[string]probeResult, []string) {
	results := map[string]probeResult{}
	var other []string
	for _, line := range strings.Split(log, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		var r probeResult
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Name == "" {
			other = append(other, line)
			continue
		}
		results[r.Name] = r
	}
	return results, other
}
