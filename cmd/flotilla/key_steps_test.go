package main

import (
	"bytes"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-io/flotilla/agent/agentapi"
	"github.com/flotilla-io/flotilla/discovery"
)

// Each step gives the keyring a cluster should hold next, leaves one
// already there as it is (a rerun continues), and refuses an order that
// would cut a member off: using a key not installed, removing the
// primary, keeping only a key that does not encrypt yet.
func TestKeySteps(t *testing.T) {
	old, next, other := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32), bytes.Repeat([]byte{3}, 32)
	fp := discovery.Fingerprint
	for _, c := range []struct {
		name    string
		step    keyStep
		ring    [][]byte
		want    [][]byte
		wantErr string
	}{
		{"install", stepInstall, [][]byte{old}, [][]byte{old, next}, ""},
		{"install again", stepInstall, [][]byte{old, next}, [][]byte{old, next}, ""},
		{"install after use", stepInstall, [][]byte{next, old}, [][]byte{next, old}, ""},
		{"use", stepUse, [][]byte{old, next}, [][]byte{next, old}, ""},
		{"use again", stepUse, [][]byte{next, old}, [][]byte{next, old}, ""},
		{"use a key not installed", stepUse, [][]byte{old}, nil, "not installed: install it first"},
		{"keep only", stepOnly, [][]byte{next, old, other}, [][]byte{next}, ""},
		{"keep only, again", stepOnly, [][]byte{next}, [][]byte{next}, ""},
		{"keep only a key that does not encrypt", stepOnly, [][]byte{old, next}, nil, "not the primary key yet"},
		{"remove", removeByFingerprint(fp(old)), [][]byte{next, old}, [][]byte{next}, ""},
		{"remove one not there", removeByFingerprint(fp(other)), [][]byte{next}, [][]byte{next}, ""},
		{"remove the primary", removeByFingerprint(fp(old)), [][]byte{old, next}, nil, "is the primary key: use another first"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.step.next(c.ring, next)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g, w := agentapi.Fingerprints(got), agentapi.Fingerprints(c.want); !sameKeys(g, w) {
				t.Errorf("keyring %v, want %v", g, w)
			}
		})
	}
}

func TestSameKeys(t *testing.T) {
	for _, c := range []struct {
		a, b []string
		want bool
	}{
		{[]string{"x", "y", "z"}, []string{"x", "z", "y"}, true},
		{[]string{"x", "y"}, []string{"y", "x"}, false},
		{[]string{"x"}, []string{"x", "y"}, false},
		{nil, nil, true},
		{nil, []string{"x"}, false},
	} {
		if got := sameKeys(c.a, c.b); got != c.want {
			t.Errorf("sameKeys(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

// The key verbs say what is missing before touching any cluster.
func TestKeyUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		say  string
	}{
		{[]string{"key"}, 2, "say what to do"},
		{[]string{"key", "turn"}, 2, `unknown verb "turn"`},
		{[]string{"key", "install"}, 2, "give --key-file"},
		{[]string{"key", "remove"}, 2, "give --key-file or --fingerprint"},
		{[]string{"key", "use", "--key-file", "/nonexistent"}, 1, "--key-file"},
	} {
		code, _, errOut := flotilla(c.args...)
		if code != c.code || !strings.Contains(errOut, c.say) {
			t.Errorf("%v: exit %d, %q; want exit %d saying %q", c.args, code, errOut, c.code, c.say)
		}
	}
	code, out, _ := flotilla("key", "generate")
	if tok, err := discovery.ParseFederationKey(out); code != 0 || err != nil || len(tok.Key) != discovery.FederationKeySize {
		t.Errorf("key generate: exit %d, %v", code, err)
	}
}

// Writing a keyring keeps the Secret's join token in step with the
// primary key, seeds and all, so an agent that restarts from its mounted
// token starts with the key in use; a Secret without a token gets none.
func TestSetRingKeepsTheToken(t *testing.T) {
	old, next := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	tok, err := discovery.JoinToken{Key: old, Seeds: []string{"192.0.2.1:7946"}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{Data: map[string][]byte{agentapi.SecretToken: []byte(tok)}}
	for _, c := range []struct {
		ring     [][]byte
		rotation string
		wantKey  []byte
	}{
		{[][]byte{old, next}, "fp", old},
		{[][]byte{next, old}, "fp", next},
		{[][]byte{next}, "", next},
	} {
		enc, err := discovery.EncodeKeyring(c.ring)
		if err != nil {
			t.Fatal(err)
		}
		setRing(s, c.ring, enc, c.rotation)
		got, err := discovery.ParseJoinToken(string(s.Data[agentapi.SecretToken]))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Key, c.wantKey) || len(got.Seeds) != 1 || got.Seeds[0] != "192.0.2.1:7946" {
			t.Errorf("ring %v: token %s, want key %s and the seed kept", agentapi.Fingerprints(c.ring), got, discovery.Fingerprint(c.wantKey))
		}
		if s.Annotations[annotationRotation] != c.rotation {
			t.Errorf("ring %v: annotation %q, want %q", agentapi.Fingerprints(c.ring), s.Annotations[annotationRotation], c.rotation)
		}
		if !bytes.Equal(s.Data[agentapi.SecretKeyring], enc) {
			t.Errorf("ring %v: keyring not written", agentapi.Fingerprints(c.ring))
		}
	}
	bare := &corev1.Secret{}
	setRing(bare, [][]byte{next}, []byte{32}, "")
	if _, ok := bare.Data[agentapi.SecretToken]; ok {
		t.Errorf("a Secret without a token got one")
	}
}
