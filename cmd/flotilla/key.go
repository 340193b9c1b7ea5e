package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/agent/agentapi"
	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/discovery"
)

func init() { register(newKeyCommand) }

func newKeyCommand() *cobra.Command {
	return withVerbs(&cobra.Command{
		Use:     "key",
		GroupID: groupFederation,
		Short:   "rotate the federation key without a partition: key rotate|status|generate|install|use|remove",
		Long: `Rotate the federation key without a partition. Every verb but generate
takes --kubeconfig (or --context), repeated for several clusters.`,
	},
		newKeyRotateCommand(),
		newKeyStatusCommand(),
		newKeyGenerateCommand(),
		newKeyStepCommand(stepInstall, "add a key that decrypts but does not yet encrypt (step 1, on every cluster)"),
		newKeyStepCommand(stepUse, "make an installed key the one that encrypts (step 2, once every cluster has it)"),
		newKeyStepCommand(removeByFingerprint(""), "retire a key (step 3, once every cluster uses the new one)"),
	)
}

// keyFlags are the flags the key verbs share.
type keyFlags struct {
	clusters  *clusterList
	namespace string
	wait      time.Duration
}

func newKeyFlags(cmd *cobra.Command) *keyFlags {
	f := &keyFlags{clusters: clusterListFlags(cmd, "for each cluster to change")}
	cmd.Flags().StringVar(&f.namespace, "namespace", "flotilla-system", "the agent's namespace")
	cmd.Flags().DurationVar(&f.wait, "wait", defaultWait, "how long to wait for each agent at each step")
	// --timeout was the name of --wait here.
	cmd.Flags().DurationVar(&f.wait, "timeout", defaultWait, "as --wait")
	_ = cmd.Flags().MarkDeprecated("timeout", "use --wait")
	return f
}

// open opens every cluster given.
func (f *keyFlags) open() ([]clusterRef, []*keyCluster, error) {
	refs, err := f.clusters.refs()
	if err != nil {
		return nil, nil, err
	}
	var out []*keyCluster
	for _, r := range refs {
		c, err := openKeyCluster(r, f.namespace)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, c)
	}
	return refs, out, nil
}

// readKeyFile reads a key or join token from path.
func readKeyFile(flagName, path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagName, err)
	}
	tok, err := discovery.ParseFederationKey(string(b))
	if err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flagName, path, err)
	}
	return tok.Key, nil
}

// currentKeyFlag defines --current-key-file: the key an agent holds when
// no Secret of the clusters given has it (the agent generated it, or it
// came by flag), so that the verbs can write the keyring that keeps it.
func currentKeyFlag(cmd *cobra.Command) *string {
	return cmd.Flags().String("current-key-file", "", "file with the key in use (a join token or base64 key), needed only when no cluster given has it in its Secret flotilla-federation (flotilla token on a gateway prints a token with it)")
}

// currentKey is a pool with the key of --current-key-file, if given.
func currentKey(path string) (keyPool, error) {
	pool := keyPool{}
	if path == "" {
		return pool, nil
	}
	k, err := readKeyFile("current-key-file", path)
	if err != nil {
		return nil, err
	}
	pool.add(k)
	return pool, nil
}

// keyStep is one step of a rotation: the keyring a cluster should hold
// after it, given the one it holds and the key the step is about.
type keyStep struct {
	name string
	// say describes the step, for the progress output.
	say  string
	next func(ring [][]byte, k []byte) ([][]byte, error)
}

var (
	stepInstall = keyStep{"install", "install key %s (it decrypts; the primary key still encrypts)", func(ring [][]byte, k []byte) ([][]byte, error) {
		if containsKey(ring, k) {
			return ring, nil
		}
		return append(slices.Clone(ring), k), nil
	}}
	stepUse = keyStep{"use", "use key %s (it encrypts; the others still decrypt)", func(ring [][]byte, k []byte) ([][]byte, error) {
		if !containsKey(ring, k) {
			return nil, fmt.Errorf("key %s is not installed: install it first, on every cluster (`%s key install`)", discovery.Fingerprint(k), progName)
		}
		return append([][]byte{k}, slices.DeleteFunc(slices.Clone(ring), func(h []byte) bool { return bytes.Equal(h, k) })...), nil
	}}
	// stepOnly is rotate's last step: every key but k goes.
	stepOnly = keyStep{"remove", "keep only key %s (the old key stops working)", func(ring [][]byte, k []byte) ([][]byte, error) {
		if !bytes.Equal(ring[0], k) {
			return nil, fmt.Errorf("key %s is not the primary key yet: use it first", discovery.Fingerprint(k))
		}
		return [][]byte{k}, nil
	}}
)

func containsKey(keys [][]byte, k []byte) bool {
	return slices.ContainsFunc(keys, func(h []byte) bool { return bytes.Equal(h, k) })
}

// sameKeys reports whether two lists of fingerprints name the same keys
// with the same primary; the order of the others does not matter.
func sameKeys(a, b []string) bool {
	if len(a) != len(b) || len(a) == 0 {
		return len(a) == len(b)
	}
	x, y := slices.Clone(a[1:]), slices.Clone(b[1:])
	slices.Sort(x)
	slices.Sort(y)
	return a[0] == b[0] && slices.Equal(x, y)
}

// runStep takes every cluster through one step: it works out every
// cluster's keyring first (so a refusal changes nothing), writes the
// Secrets that must change, then waits until every agent holds its
// keyring. Each cluster already there is left alone: a rerun continues.
func runStep(ctx context.Context, w io.Writer, cs []*keyCluster, pool keyPool, step keyStep, k []byte, rotation string, timeout time.Duration) error {
	type plan struct {
		ring  [][]byte
		write bool
	}
	plans := make([]plan, len(cs))
	for i, c := range cs {
		s, err := c.secret(ctx)
		if err != nil {
			return err
		}
		st, err := c.status(ctx)
		if err != nil {
			return err
		}
		if st.cluster != "" {
			c.name = st.cluster
		}
		ring, err := c.ring(s, st, pool)
		if err != nil {
			return err
		}
		next, err := step.next(ring, k)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		// A Secret without a keyring gets one even when nothing changes:
		// from then on it, not the flags, says what the agent holds.
		fromSecret := s != nil && len(s.Data[agentapi.SecretKeyring]) > 0
		plans[i] = plan{ring: next, write: !fromSecret || !sameKeys(agentapi.Fingerprints(ring), agentapi.Fingerprints(next)) ||
			s.Annotations[annotationRotation] != rotation}
	}
	for i, c := range cs {
		if !plans[i].write {
			continue
		}
		if err := c.write(ctx, plans[i].ring, rotation); err != nil {
			return err
		}
	}
	for i, c := range cs {
		if err := c.wait(ctx, w, agentapi.Fingerprints(plans[i].ring), timeout); err != nil {
			return err
		}
	}
	return nil
}

func newKeyRotateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rotate",
		Short: "move every cluster given to a new key: install it, use it, remove the old one, waiting for every agent at each step; a rerun continues",
		Args:  noArgs,
	}
	f := newKeyFlags(cmd)
	current := currentKeyFlag(cmd)
	partial := cmd.Flags().Bool("partial", false, "rotate the clusters given even though other members of the federation are not among them (those lose the federation at step 2 unless they take the steps themselves)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		return rotateKey(cmd.Context(), cmd.OutOrStdout(), f, *current, *partial)
	}
	return cmd
}

func rotateKey(ctx context.Context, stdout io.Writer, f *keyFlags, currentFile string, partial bool) error {
	refs, cs, err := f.open()
	if err != nil {
		return err
	}
	if !partial {
		if err := allMembersGiven(ctx, refs, cs); err != nil {
			return err
		}
	}
	pool, err := currentKey(currentFile)
	if err != nil {
		return err
	}
	var next []byte
	for _, c := range cs {
		s, err := c.secret(ctx)
		if err != nil {
			return err
		}
		pool.addSecret(s)
		if s != nil && next == nil {
			next = pool[s.Annotations[annotationRotation]]
		}
	}
	if next != nil {
		fmt.Fprintf(stdout, "continuing the rotation to key %s\n", discovery.Fingerprint(next))
	} else {
		if next, err = discovery.GenerateFederationKey(); err != nil {
			return err
		}
		pool.add(next)
		fmt.Fprintf(stdout, "rotating to the new key %s\n", discovery.Fingerprint(next))
	}
	fp := discovery.Fingerprint(next)
	steps := []struct {
		step     keyStep
		rotation string
	}{{stepInstall, fp}, {stepUse, fp}, {stepOnly, ""}}
	for i, s := range steps {
		fmt.Fprintf(stdout, "step %d of %d: "+s.step.say+" on %d cluster(s)\n", i+1, len(steps), fp, len(cs))
		if err := runStep(ctx, stdout, cs, pool, s.step, next, s.rotation, f.wait); err != nil {
			return fmt.Errorf("step %d (%s): %w", i+1, s.step.name, err)
		}
	}
	fmt.Fprintf(stdout, "every cluster holds only key %s; clusters that join from now on need a join token with it (`%s token`)\n", fp, progName)
	return nil
}

// allMembersGiven refuses a rotation that leaves out a member of the
// federation: one that every cluster given sees as a member but that is
// not given would be cut off when the others start using the new key.
func allMembersGiven(ctx context.Context, refs []clusterRef, cs []*keyCluster) error {
	given := map[string]bool{}
	for _, c := range cs {
		st, err := c.status(ctx)
		if err != nil {
			return err
		}
		given[st.cluster] = true
	}
	missing := map[string]bool{}
	for i, r := range refs {
		cl, err := r.client()
		if err != nil {
			return err
		}
		peers, err := listPeers(ctx, cl)
		if err != nil {
			return fmt.Errorf("%s: %w", cs[i].name, err)
		}
		for _, p := range peers {
			if m := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionMember); m != nil && m.Status == metav1.ConditionTrue && !given[p.Status.ClusterName] {
				missing[peerName(p)] = true
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	names := slices.Sorted(maps.Keys(missing))
	return fmt.Errorf("the federation has members not given: %s; give each one's --kubeconfig, or let their admins take the steps themselves (`%s key install|use|remove`) and pass --partial",
		strings.Join(names, ", "), progName)
}

// newKeyStepCommand is install, use or remove: one step on the clusters
// given.
func newKeyStepCommand(step keyStep, short string) *cobra.Command {
	cmd := &cobra.Command{Use: step.name, Short: short, Args: noArgs}
	f := newKeyFlags(cmd)
	keyFile := cmd.Flags().String("key-file", "", "file with the key (base64, as key generate prints it, or a join token)")
	current := currentKeyFlag(cmd)
	var fingerprint *string
	if step.name == "remove" {
		fingerprint = cmd.Flags().String("fingerprint", "", "the fingerprint of the key to remove (key status shows them), instead of --key-file")
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		fp := ""
		if fingerprint != nil {
			fp = *fingerprint
		}
		return keyStepOn(cmd.Context(), cmd.OutOrStdout(), f, step, *keyFile, fp, *current)
	}
	return cmd
}

// keyStepOn takes the clusters through step with the key in keyFile,
// or, to remove one, named by its fingerprint.
func keyStepOn(ctx context.Context, stdout io.Writer, f *keyFlags, step keyStep, keyFile, fingerprint, currentFile string) error {
	var k []byte
	var what string
	var err error
	switch {
	case keyFile != "":
		if k, err = readKeyFile("key-file", keyFile); err != nil {
			return err
		}
		what = discovery.Fingerprint(k)
	case step.name == "remove" && fingerprint != "":
		// The agents' status names every key by fingerprint: removing one
		// needs no key bytes.
		what = fingerprint
	case step.name == "remove":
		return usageErrorf("give --key-file or --fingerprint")
	default:
		return usageErrorf("give --key-file")
	}
	_, cs, err := f.open()
	if err != nil {
		return err
	}
	pool, err := currentKey(currentFile)
	if err != nil {
		return err
	}
	for _, c := range cs {
		s, err := c.secret(ctx)
		if err != nil {
			return err
		}
		pool.addSecret(s)
	}
	if k != nil {
		pool.add(k)
	}
	if step.name == "remove" {
		step = removeByFingerprint(what)
	}
	fmt.Fprintf(stdout, step.say+" on %d cluster(s)\n", what, len(cs))
	if err := runStep(ctx, stdout, cs, pool, step, k, "", f.wait); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "done: %s\n", step.name)
	return nil
}

// removeByFingerprint removes the key named fp from a keyring.
func removeByFingerprint(fp string) keyStep {
	return keyStep{"remove", "remove key %s", func(ring [][]byte, _ []byte) ([][]byte, error) {
		if discovery.Fingerprint(ring[0]) == fp {
			return nil, fmt.Errorf("key %s is the primary key: use another first, on every cluster (`%s key use`)", fp, progName)
		}
		return slices.DeleteFunc(slices.Clone(ring), func(h []byte) bool { return discovery.Fingerprint(h) == fp }), nil
	}}
}

func newKeyGenerateCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "generate",
		Short: "print a new federation key (a secret) for install and use, where each organisation runs its own steps",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			k, err := discovery.GenerateFederationKey()
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), base64.StdEncoding.EncodeToString(k))
			return nil
		},
	}
}

// keyStatusRow is one cluster in `key status`: fingerprints only.
type keyStatusRow struct {
	Cluster string `json:"cluster"`
	// Holds are the keys the agent holds, primary first.
	Holds []string `json:"holds"`
	// SecretAsks is the keyring of the Secret, primary first; empty when
	// the Secret has none (the agent holds the keys of its flags or
	// ledger).
	SecretAsks []string `json:"secretAsks,omitempty"`
	// SecretDamaged: the Secret's keyring does not decode (the agent's
	// Error says how).
	SecretDamaged bool   `json:"secretDamaged,omitempty"`
	Error         string `json:"error,omitempty"`
}

func newKeyStatusCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status",
		Short: "the keys each cluster's agent holds and its Secret asks for (fingerprints only)",
		Args:  noArgs,
	}
	f := newKeyFlags(cmd)
	formats := []output{outputWide, outputJSON, outputYAML}
	o := outputFlag(cmd, formats...)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		format, err := parseOutput(*o, formats...)
		if err != nil {
			return err
		}
		return showKeyStatus(cmd.Context(), cmd.OutOrStdout(), f, format)
	}
	return cmd
}

func showKeyStatus(ctx context.Context, stdout io.Writer, f *keyFlags, format output) error {
	_, cs, err := f.open()
	if err != nil {
		return err
	}
	var rows []keyStatusRow
	for _, c := range cs {
		st, err := c.status(ctx)
		if err != nil {
			return err
		}
		s, err := c.secret(ctx)
		if err != nil {
			return err
		}
		row := keyStatusRow{Cluster: st.cluster, Holds: st.keys, Error: st.err}
		if row.Cluster == "" {
			row.Cluster = c.name
		}
		if s != nil && len(s.Data[agentapi.SecretKeyring]) > 0 {
			if ring, err := discovery.DecodeKeyring(s.Data[agentapi.SecretKeyring]); err != nil {
				row.SecretDamaged = true
			} else {
				row.SecretAsks = agentapi.Fingerprints(ring)
			}
		}
		rows = append(rows, row)
	}
	if format == outputJSON || format == outputYAML {
		return writeJSONOrYAML(stdout, rows, format)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tHOLDS\tSECRET ASKS\tERROR")
	for _, r := range rows {
		asks := "-"
		switch {
		case r.SecretDamaged:
			asks = "damaged keyring"
		case len(r.SecretAsks) > 0:
			asks = describeKeys(r.SecretAsks)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Cluster, describeKeys(r.Holds), asks, orDash(strings.TrimSpace(r.Error)))
	}
	return tw.Flush()
}
