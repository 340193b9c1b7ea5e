package tunnel

import "testing"

// A table's record holds without a read-back only across generations
// the session's other tables made alone: a generation of anyone else's,
// of the table itself, or one whose predecessor was not known, makes it
// read its table back.
func TestRecordHoldsAcrossOtherTablesTransactions(t *testing.T) {
	tests := []struct {
		name     string
		made     func(s *nftSession)
		from, to uint32
		want     bool
	}{
		{"the filter's transaction, alone", func(s *nftSession) { s.madeAlone("filter", 10, 11) }, 10, 11, true},
		{"two of the filter's in a row", func(s *nftSession) { s.madeAlone("filter", 10, 11); s.madeAlone("filter", 11, 12) }, 10, 12, true},
		{"someone else's before the filter's", func(s *nftSession) { s.madeAlone("filter", 11, 12) }, 10, 12, false},
		{"someone else's with the filter's", func(s *nftSession) { s.madeAlone("filter", 10, 12) }, 10, 12, false},
		{"someone else's after the filter's", func(s *nftSession) { s.madeAlone("filter", 10, 11) }, 10, 12, false},
		{"the table's own", func(s *nftSession) { s.madeAlone("nat", 10, 11) }, 10, 11, false},
		{"a generation before the record", func(s *nftSession) { s.madeAlone("filter", 10, 11) }, 11, 10, false},
		{"across the counter's wrap", func(s *nftSession) { s.madeAlone("filter", ^uint32(0), 0) }, ^uint32(0), 0, true},
		{"forgotten, too long ago", func(s *nftSession) {
			for g := uint32(10); g < 10+2*ownGenerations; g++ {
				s.madeAlone("filter", g, g+1)
			}
		}, 10, 11, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &nftSession{}
			tt.made(s)
			if got := s.untouched("nat", tt.from, tt.to); got != tt.want {
				t.Fatalf("untouched(nat, %d, %d) = %v, want %v", tt.from, tt.to, got, tt.want)
			}
		})
	}
}
