package harness

import (
	"regexp"
	"strconv"
)

// NFTCounter is the packet count of the rule whose comment is comment in
// listing, the output of `nft list ...`; it fails t when no such rule
// with a counter is there.
func NFTCounter(t TB, listing, comment string) uint64 {
	t.Helper()
	m := regexp.MustCompile(`counter packets (\d+) bytes \d+[^"\n]* comment "` + regexp.QuoteMeta(comment) + `"`).FindStringSubmatch(listing)
	if m == nil {
		t.Fatalf("no counter %q in:\n%s", comment, listing)
	}
	n, _ := strconv.ParseUint(m[1], 10, 64)
	return n
}
