package identity

import (
	"errors"
	"testing"
)

func TestClusterIDIsStableAndValid(t *testing.T) {
	id, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	again, err := FromSeed(id.Seed())
	if err != nil {
		t.Fatal(err)
	}
	if id.ClusterID() != again.ClusterID() {
		t.Fatalf("ID changed across seed round trip: %s vs %s", id.ClusterID(), again.ClusterID())
	}
	if err := ValidateClusterID(id.ClusterID()); err != nil {
		t.Fatal(err)
	}
}

func TestVerify(t *testing.T) {
	a, _ := Generate()
	b, _ := Generate()
	msg := []byte("networks: 10.0.0.0/16")
	sig := a.Sign(msg)
	tests := []struct {
		name    string
		cluster string
		pub     []byte
		msg     []byte
		wantErr bool
		badSig  bool
	}{
		{"valid", a.ClusterID(), a.Public(), msg, false, false},
		{"tampered message", a.ClusterID(), a.Public(), []byte("networks: 10.1.0.0/16"), true, true},
		{"key of another cluster", a.ClusterID(), b.Public(), msg, true, false},
		{"claimed ID of another cluster", b.ClusterID(), a.Public(), msg, true, false},
		{"short key", a.ClusterID(), a.Public()[:10], msg, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Verify(tt.cluster, tt.pub, tt.msg, sig)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Verify: err=%v, wantErr=%v", err, tt.wantErr)
			}
			if tt.badSig && !errors.Is(err, ErrBadSignature) {
				t.Fatalf("want ErrBadSignature, got %v", err)
			}
		})
	}
}

func TestValidateClusterIDRejects(t *testing.T) {
	for _, id := range []string{"", "c", "x" + "aaaaaaaaaaaaaaaaaaaaaaaaaa", "c" + "aaaaaaaaaaaaaaaaaaaaaaaaa!", "c" + "AAAAAAAAAAAAAAAAAAAAAAAAAA"} {
		if ValidateClusterID(id) == nil {
			t.Errorf("ValidateClusterID(%q) accepted", id)
		}
	}
}
