package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flotilla-io/flotilla/observe/trace"
	"github.com/flotilla-io/flotilla/observe/trace/collect"
)

func init() {
	register(command{name: "trace", summary: "why can't SOURCE reach DESTINATION: the path between two clusters' pods, step by step", run: runTrace})
}

// errBroken: the trace found a broken step, already printed; the exit
// status says so to scripts.
var errBroken = errors.New("a step is broken")

func runTrace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("trace", stderr)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the source's cluster (default: $KUBECONFIG or ~/.kube/config)")
	kubeContext := contextFlag(fs)
	peerKubeconfig := fs.String("peer-kubeconfig", "", "kubeconfig of the destination's cluster (default: --kubeconfig's)")
	peerContext := fs.String("peer-context", "", "the destination cluster's context: its side of the path is read too (default: only the source's side)")
	o := fs.String("o", "", "output format: json or yaml; empty: text")
	fs.StringVar(o, "output", "", "output format (as -o)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: %s trace SOURCE DESTINATION [flags]

SOURCE is a pod of this cluster (name, namespace/name or address);
DESTINATION a pod of a peer: its address as this cluster addresses it
(kubectl get peers -o wide shows the views), its real address there, or,
with --peer-context, its name. Exit status 1 when a step is broken.

`, progName)
		fs.PrintDefaults()
	}
	var ends []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") && len(ends) < 2 {
		ends, args = append(ends, args[0]), args[1:]
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if len(ends) != 2 {
		fmt.Fprintf(stderr, "flotilla trace: name the SOURCE and the DESTINATION first\n")
		fs.Usage()
		return errUsage
	}
	if *o != "" && *o != "json" && *o != "yaml" {
		fmt.Fprintf(stderr, "flotilla trace: -o %q: want json or yaml (or nothing, for text)\n", *o)
		return errUsage
	}
	src, dst := ends[0], ends[1]
	local, err := traceSide(ctx, *kubeconfig, *kubeContext, collect.Ends{Names: nameOf(src), Addrs: addrOf(src)})
	if err != nil {
		return err
	}
	var remote *trace.Cluster
	if *peerContext != "" || *peerKubeconfig != "" {
		pk := *peerKubeconfig
		if pk == "" {
			pk = *kubeconfig
		}
		remote, err = traceSide(ctx, pk, *peerContext, collect.Ends{Names: nameOf(dst), Addrs: trace.Candidates(local, dst)})
		if err != nil {
			return fmt.Errorf("peer cluster: %w", err)
		}
	}
	trace.Name(local, remote)
	res := trace.Run(local, remote, src, dst, time.Now())
	if *o == "" {
		err = trace.WriteText(stdout, res)
	} else {
		err = writeJSONOrYAML(stdout, res, output(*o))
	}
	if err != nil {
		return err
	}
	if res.Broken != "" {
		return errBroken
	}
	return nil
}

// traceSide reads one cluster, named after its context.
func traceSide(ctx context.Context, kubeconfig, kubeContext string, ends collect.Ends) (*trace.Cluster, error) {
	cfg, name, err := restConfigIn(kubeconfig, kubeContext)
	if err != nil {
		return nil, err
	}
	return collect.Collect(ctx, collect.Source{Name: name, Config: cfg}, ends)
}

// restConfigIn loads a kubeconfig's context, and that context's name.
func restConfigIn(kubeconfig, kubeContext string) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext})
	cfg, err := loader.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	name := kubeContext
	if raw, err := loader.RawConfig(); err == nil && name == "" {
		name = raw.CurrentContext
	}
	return cfg, name, nil
}

func nameOf(s string) []string {
	if _, err := netip.ParseAddr(s); err == nil {
		return nil
	}
	return []string{s}
}

func addrOf(s string) []netip.Addr {
	if a, err := netip.ParseAddr(s); err == nil {
		return []netip.Addr{a}
	}
	return nil
}
