package tunnel_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/tunnel"
	"github.com/prometheus/client_golang/prometheus"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/ipc"
	"golang.zx2c4.com/wireguard/tun"
)

// helperArg makes the test binary run as the tunnel component of one site
// instead of running tests: the tests start it inside a site's network
// namespace, the way the agent runs on its gateway's host network.
const helperArg = "tunnel-helper"

// bareArg makes the test binary act as the wireguard-go command: a TUN
// served by the same wireguard-go library, with a control socket for wg(8)
// and nothing else. It is the hand-configured peer and baseline of tests
// and benchmarks. With a batch size after the interface name, its reads
// come in batches of that many, as the agent's device's do.
const bareArg = "wireguard-go-bare"

func bareMain(ifname string, batch int) int {
	var tdev tun.Device
	tdev, err := tun.CreateTUN(ifname, device.DefaultMTU)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	bind := conn.NewDefaultBind()
	if batch > 0 {
		if tdev, bind, err = tunnel.Batched(tdev, bind, batch); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	dev := device.NewDevice(tdev, bind, device.NewLogger(device.LogLevelError, ifname+": "))
	f, err := ipc.UAPIOpen(ifname)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	uapi, err := ipc.UAPIListen(ifname, f)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
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
	fmt.Println("ready")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	uapi.Close()
	dev.Close()
	os.Remove("/var/run/wireguard/" + ifname + ".sock")
	return 0
}

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == helperArg {
		os.Exit(helperMain(os.Args[2:]))
	}
	if len(os.Args) > 2 && os.Args[1] == bareArg {
		batch := 0
		if len(os.Args) > 3 {
			batch, _ = strconv.Atoi(os.Args[3])
		}
		os.Exit(bareMain(os.Args[2], batch))
	}
	os.Exit(m.Run())
}

// helperMain runs a Tunnel fed from a JSON desired-state file it watches.
// After each apply it writes "<sha256 of the file> ok" or the error to
// <desired>.applied, the peers' status to <desired>.status and its
// counters without labels to <desired>.metrics. On SIGTERM
// it closes the tunnel (the data path stays); with -cleanup it removes
// everything instead. With -watch=false it repairs nothing between
// applies: what a test breaks by hand stays broken. SIGUSR1 suspends the data path, SIGUSR2 resumes it;
// each logs "suspended" or "resumed" once done.
func helperMain(args []string) int {
	fs := flag.NewFlagSet(helperArg, flag.ContinueOnError)
	ifname := fs.String("interface", tunnel.DefaultInterface, "")
	mode := fs.String("mode", "auto", "")
	port := fs.Int("port", tunnel.DefaultPort, "")
	keyFile := fs.String("key", "", "")
	desiredFile := fs.String("desired", "", "")
	cleanup := fs.Bool("cleanup", false, "remove everything on exit")
	firstContactWait := fs.Duration("first-contact-wait", 0, "")
	watch := fs.Bool("watch", true, "repair from kernel events and the periodic resync (Run); off, only applies change anything")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	fail := func(err error) int { log.Error("tunnel helper", "err", err); return 1 }
	m, err := tunnel.ParseMode(*mode)
	if err != nil {
		return fail(err)
	}
	key, err := tunnel.LoadOrCreateKeyFile(*keyFile)
	if err != nil {
		return fail(err)
	}
	start := time.Now()
	reg := prometheus.NewRegistry()
	tun, err := tunnel.New(tunnel.Config{Interface: *ifname, Mode: m, ListenPort: *port, PrivateKey: key, FirstContactWait: *firstContactWait, Logger: log, Metrics: reg})
	if err != nil {
		return fail(err)
	}
	log.Info("tunnel up", "kernel", tun.Kernel(), "took", time.Since(start))
	// What the kernel held of the policy at start, as an agent reads it
	// to hold it until it has decided anew.
	if held, err := tun.PolicySets(); err != nil {
		log.Error("read the policy sets", "err", err)
	} else {
		b, _ := json.Marshal(held)
		writeAtomic(*desiredFile+".held", b)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *watch {
		go func() {
			if err := tun.Run(ctx); err != nil {
				log.Error("tunnel watch", "err", err)
			}
		}()
	}
	fence := make(chan os.Signal, 2)
	signal.Notify(fence, syscall.SIGUSR1, syscall.SIGUSR2)
	var last string
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	statusEvery := time.NewTicker(200 * time.Millisecond)
	defer statusEvery.Stop()
	for {
		select {
		case <-ctx.Done():
			if *cleanup {
				if err := tun.Cleanup(); err != nil {
					return fail(err)
				}
				return 0
			}
			if err := tun.Close(); err != nil {
				return fail(err)
			}
			return 0
		case sig := <-fence:
			if sig == syscall.SIGUSR1 {
				log.Info("suspended", "err", tun.Suspend())
			} else {
				log.Info("resumed", "err", tun.Resume())
			}
		case <-statusEvery.C:
			if st, err := tun.Status(); err == nil {
				b, _ := json.Marshal(st)
				writeAtomic(*desiredFile+".status", b)
			}
			if b, err := json.Marshal(counters(reg)); err == nil {
				writeAtomic(*desiredFile+".metrics", b)
			}
		case <-tick.C:
			b, err := os.ReadFile(*desiredFile)
			if err != nil {
				continue
			}
			sum := sha256.Sum256(b)
			h := hex.EncodeToString(sum[:])
			if h == last {
				continue
			}
			last = h
			result := h + " ok"
			d, err := tunnel.ParseDesired(b)
			if err == nil {
				t0 := time.Now()
				err = tun.Apply(ctx, d)
				log.Info("applied", "peers", len(d.Peers), "took", time.Since(t0), "err", err)
			}
			if err != nil {
				result = h + " error: " + err.Error()
			}
			writeAtomic(*desiredFile+".applied", []byte(result))
		}
	}
}

// counters are the values of reg's counters that have no labels, by name.
func counters(reg *prometheus.Registry) map[string]float64 {
	out := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if len(mf.GetMetric()) == 1 && len(mf.GetMetric()[0].GetLabel()) == 0 && mf.GetMetric()[0].GetCounter() != nil {
			out[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return out
}

func writeAtomic(path string, b []byte) {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	os.Rename(tmp, path)
}
