package chaos_test

import "testing"

func TestUnansweredOf(t *testing.T) {
	log := `PING 100.96.0.5 (100.96.0.5) 56(84) bytes of data.
64 bytes from 100.96.0.5: icmp_seq=1 ttl=62 time=0.580 ms
From 100.96.0.1 icmp_seq=2 Destination Host Unreachable
64 bytes from 100.96.0.5: icmp_seq=4 ttl=62 time=0.368 ms
64 bytes from 100.96.0.5: icmp_seq=4 ttl=62 time=0.370 ms (DUP!)

--- 100.96.0.5 ping statistics ---
6 packets transmitted, 3 received, +1 duplicates, 50% packet loss, time 500ms
`
	// 2 (an error, not a reply), 3 and 5 went unanswered; 6, the last
	// sent, may have been on its way when ping was stopped.
	if n := unansweredOf(log, 6); n != 3 {
		t.Errorf("unansweredOf = %d, want 3", n)
	}
	if n := unansweredOf(log, 1); n != 0 {
		t.Errorf("unansweredOf with one sent = %d, want 0", n)
	}
}
