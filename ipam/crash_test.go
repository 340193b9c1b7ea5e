package ipam

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const crashChildEnv = "FLOTILLA_IPAM_CRASH_CHILD"

func TestMain(m *testing.M) {
	if path := os.Getenv(crashChildEnv); path != "" {
		crashChild(path)
		return
	}
	os.Exit(m.Run())
}

var crashOpts = Options{
	Pools:      []netip.Prefix{pfx("100.96.0.0/14"), pfx("fddc:467:9000::/46")},
	Quarantine: 20 * time.Millisecond,
}

var crashRanges = []string{"10.0.0.0/16", "10.0.0.0/20", "10.5.0.0/16", "100.96.0.0/16", "fd00:10::/48", "fd00:10::/56"}

// crashChild maps and releases views until it is killed. It prints
// "begin KEYS" before each write and "done RESULTS" (or "abort ERROR")
// after the write has returned, each as one write to the pipe, so the
// parent knows what was committed.
func crashChild(path string) {
	l, err := Open(path, crashOpts)
	if err != nil {
		fmt.Printf("open %v\n", err)
		os.Exit(1)
	}
	seed, err := l.LoadOrCreateKey("identity", func() ([]byte, error) {
		return []byte(fmt.Sprint(time.Now().UnixNano())), nil
	})
	if err != nil {
		fmt.Printf("key %v\n", err)
		os.Exit(1)
	}
	os.Stdout.WriteString("key " + hex.EncodeToString(seed) + "\n")
	if _, err := l.SetLocalNetworks([]LocalNetwork{{Range: pfx("10.0.0.0/16"), Kind: PodNetwork}, {Range: pfx("fd00:10::/56"), Kind: PodNetwork}}); err != nil {
		fmt.Printf("locals %v\n", err)
		os.Exit(1)
	}
	childSeed, err := strconv.ParseUint(os.Getenv(seedEnv), 10, 64)
	if err != nil {
		fmt.Printf("seed %v\n", err)
		os.Exit(1)
	}
	r := rand.New(rand.NewPCG(childSeed, 1))
	key := func(p string, rg netip.Prefix) string { return p + "," + rg.String() }
	for {
		peer := fmt.Sprintf("c%d", r.IntN(12))
		var begin []string
		var done []string
		var err error
		switch n := r.IntN(100); {
		case n < 55:
			rg := pfx(crashRanges[r.IntN(len(crashRanges))])
			begin = []string{key(peer, rg)}
			os.Stdout.WriteString("begin " + strings.Join(begin, " ") + "\n")
			var v netip.Prefix
			if v, err = l.ViewOf(peer, rg); err == nil {
				done = []string{"map," + key(peer, rg) + "," + v.String()}
			}
		case n < 80:
			vs := l.Views("")
			if len(vs) == 0 {
				continue
			}
			v := vs[r.IntN(len(vs))]
			begin = []string{key(v.Peer, v.Remote)}
			os.Stdout.WriteString("begin " + strings.Join(begin, " ") + "\n")
			if err = l.Release(v.Peer, v.Remote); err == nil {
				done = []string{"del," + key(v.Peer, v.Remote)}
			}
		case n < 84:
			// A grant (offload/grant keeps them sealed here): put, or
			// replaced by the next.
			val := fmt.Sprintf("sealed-%d", r.Uint64())
			begin = []string{"grant:" + peer}
			os.Stdout.WriteString("begin " + strings.Join(begin, " ") + "\n")
			if err = l.PutGrant(peer, []byte(val)); err == nil {
				done = []string{"grant," + peer + "," + val}
			}
		case n < 88:
			for _, v := range l.Views(peer) {
				begin = append(begin, key(v.Peer, v.Remote))
				done = append(done, "del,"+key(v.Peer, v.Remote))
			}
			if len(begin) == 0 {
				continue
			}
			os.Stdout.WriteString("begin " + strings.Join(begin, " ") + "\n")
			err = l.ReleasePeer(peer)
		case n < 94:
			// Two peers' ranges changed in one batch (peering's reconcile):
			// one commit for both; a sync that fails is undone alone.
			peers := []string{peer, fmt.Sprintf("c%d", 12+r.IntN(4))}
			ranges := []netip.Prefix{pfx(crashRanges[r.IntN(len(crashRanges))]), pfx(crashRanges[r.IntN(len(crashRanges))])}
			old := map[string][]View{}
			for i, p := range peers {
				old[p] = l.Views(p)
				for _, v := range old[p] {
					begin = append(begin, key(p, v.Remote))
				}
				begin = append(begin, key(p, ranges[i]))
			}
			os.Stdout.WriteString("begin " + strings.Join(begin, " ") + "\n")
			err = l.Batch(func(b Batch) error {
				for i, p := range peers {
					vs, err := b.SyncPeer(p, ranges[i:i+1])
					if err != nil {
						continue // undone alone: p's views stay as they were
					}
					for _, v := range old[p] {
						if v.Remote != ranges[i] {
							done = append(done, "del,"+key(p, v.Remote))
						}
					}
					done = append(done, "map,"+key(p, ranges[i])+","+vs[0].View.String())
				}
				return nil
			})
		default:
			var reqs []ViewRequest
			for i := 0; i < 3; i++ {
				rq := ViewRequest{fmt.Sprintf("c%d", r.IntN(12)), pfx(crashRanges[r.IntN(len(crashRanges))])}
				reqs = append(reqs, rq)
				begin = append(begin, key(rq.Peer, rq.Remote))
			}
			os.Stdout.WriteString("begin " + strings.Join(begin, " ") + "\n")
			var vs []View
			if vs, err = l.ViewsOf(reqs); err == nil {
				for _, v := range vs {
					done = append(done, "map,"+key(v.Peer, v.Remote)+","+v.View.String())
				}
			}
		}
		if err != nil {
			os.Stdout.WriteString("abort " + strings.ReplaceAll(err.Error(), "\n", " ") + "\n")
			continue
		}
		os.Stdout.WriteString("done " + strings.Join(done, " ") + "\n")
	}
}

func TestCrashSafety(t *testing.T) {
	rounds := 50
	if testing.Short() {
		rounds = 10
	}
	path := filepath.Join(t.TempDir(), FileName)
	committed := map[string]string{} // "peer,remote" -> view, per the child's done lines
	grants := map[string]string{}    // peer -> the grant put last, per the done lines
	var identity string
	var commits, midOp int
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	for round := 0; round < rounds; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		// Each child draws its operations from its own seed, derived from the
		// run's, so the whole run replays from the one seed it logged.
		cmd.Env = append(os.Environ(), crashChildEnv+"="+path, seedEnv+"="+strconv.FormatUint(seed+uint64(round), 10))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan []string, 1)
		opened := make(chan struct{}) // the child said its key: the ledger is open
		go func() {
			var ls []string
			s := bufio.NewScanner(out)
			for s.Scan() {
				if len(ls) == 0 {
					close(opened)
				}
				ls = append(ls, s.Text())
			}
			if len(ls) == 0 {
				close(opened)
			}
			lines <- ls
		}()
		// The kill falls at a random point of the child's writes, counted
		// from its ledger's opening: on a busy machine the start of a
		// process alone can take longer than the whole window.
		select {
		case <-opened:
		case <-time.After(time.Minute):
			cmd.Process.Signal(syscall.SIGKILL)
			t.Fatalf("round %d: the child did not open the ledger within a minute", round)
		}
		time.Sleep(time.Duration(20+rng.IntN(180)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		ls := <-lines
		cmd.Wait()

		inFlight := map[string]bool{}
		for _, line := range ls {
			word, rest, _ := strings.Cut(line, " ")
			switch word {
			case "key":
				if identity == "" {
					identity = rest
				} else if rest != identity {
					t.Fatalf("round %d: identity key changed from %s to %s", round, identity, rest)
				}
			case "begin":
				inFlight = map[string]bool{}
				for _, k := range strings.Fields(rest) {
					inFlight[k] = true
				}
			case "abort":
				inFlight = map[string]bool{}
			case "done":
				commits++
				for _, e := range strings.Fields(rest) {
					f := strings.Split(e, ",")
					if f[0] == "grant" {
						grants[f[1]] = f[2]
						continue
					}
					k := f[1] + "," + f[2]
					if f[0] == "map" {
						committed[k] = f[3]
					} else {
						delete(committed, k)
					}
				}
				inFlight = map[string]bool{}
			default:
				t.Fatalf("round %d: child said %q", round, line)
			}
		}
		if len(inFlight) > 0 {
			midOp++
		}

		l, err := Open(path, crashOpts)
		if err != nil {
			t.Fatalf("round %d: reopen after SIGKILL: %v", round, err)
		}
		if err := checkInvariants(l); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		actual := map[string]string{}
		for _, v := range l.Views("") {
			actual[v.Peer+","+v.Remote.String()] = v.View.String()
		}
		if identity != "" {
			seed, err := l.Key("identity")
			if err != nil || hex.EncodeToString(seed) != identity {
				t.Fatalf("round %d: identity key %x, %v; want %s", round, seed, err, identity)
			}
		}
		for peer, v := range grants {
			if got, err := l.Grant(peer); !inFlight["grant:"+peer] && (err != nil || string(got) != v) {
				t.Fatalf("round %d: committed grant from %s %q lost (ledger has %q, %v)", round, peer, v, got, err)
			}
		}
		for k := range inFlight {
			if peer, ok := strings.CutPrefix(k, "grant:"); ok {
				if got, err := l.Grant(peer); err == nil {
					grants[peer] = string(got)
				}
			}
		}
		l.Close()
		for k, v := range committed {
			if !inFlight[k] && actual[k] != v {
				t.Fatalf("round %d: committed view %s -> %s lost (ledger has %q)", round, k, v, actual[k])
			}
		}
		for k, v := range actual {
			if _, ok := committed[k]; !ok && !inFlight[k] {
				t.Fatalf("round %d: released view %s -> %s came back", round, k, v)
			}
		}
		// What the interrupted write did is whatever the ledger now says.
		for k := range inFlight {
			if v, ok := actual[k]; ok {
				committed[k] = v
			} else {
				delete(committed, k)
			}
		}
	}
	t.Logf("%d rounds, %d committed writes, %d kills in the middle of a write, %d views and %d grants at the end", rounds, commits, midOp, len(committed), len(grants))
	if commits < rounds {
		t.Fatalf("only %d writes committed in %d rounds: the child is not exercising the ledger", commits, rounds)
	}
}
