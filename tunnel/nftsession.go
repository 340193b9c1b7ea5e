package tunnel

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// nftSession is a tunnel's netlink sockets to nf_tables, opened in its
// network namespace and kept until Close, through which every read and
// transaction of its tables goes.
//
// Kept open because closing one costs a removal its latency: the kernel
// frees what a transaction deleted after an RCU grace period, in a work
// item of its own, but the release of any NETLINK_NETFILTER socket waits
// for that work to finish. A socket per transaction made every deletion
// (one element of a set, a chain) wait about 10 ms after the kernel had
// committed it; an addition frees nothing and did not wait.
//
// Not safe for concurrent use: the tunnel's mutex guards it.
type nftSession struct {
	ns netns.NsHandle // not owned; none: the calling thread's
	// perOperation dials a socket for each operation and closes it
	// after, for benchmarks to compare with.
	perOperation bool

	c   *nftables.Conn // nil until used, and after fail
	raw *netlink.Conn  // the generation and the rule dump, which the library does not ask for

	// alone are generations a transaction of one of the session's tables
	// made with nothing else committed since that table's last one, by
	// the table it changed: the other tables are as they were before it.
	alone      map[uint32]string
	aloneOrder []uint32 // oldest first, at most ownGenerations
}

// madeAlone records that a transaction of table took the ruleset from
// generation before to after; it counts only when nothing else committed
// in between (each commit adds one).
func (s *nftSession) madeAlone(table string, before, after uint32) {
	if after != before+1 {
		return
	}
	if s.alone == nil {
		s.alone = map[uint32]string{}
	}
	s.alone[after] = table
	s.aloneOrder = append(s.aloneOrder, after)
	if len(s.aloneOrder) > ownGenerations {
		delete(s.alone, s.aloneOrder[0])
		s.aloneOrder = s.aloneOrder[1:]
	}
}

// untouched reports whether every transaction from generation from to
// to was one of the session's other tables', made alone: table is then
// as it was at from, without reading it back.
func (s *nftSession) untouched(table string, from, to uint32) bool {
	if to-from > ownGenerations {
		return false // also when to is before from
	}
	for g := from + 1; g != to+1; g++ {
		if t, ok := s.alone[g]; !ok || t == table {
			return false
		}
	}
	return true
}

// conn returns the session's connection. A caller that queues messages
// on it flushes them, or returns an error after which the tables call
// fail: a connection keeps what was queued, and its first serialisation
// error, until then.
func (s *nftSession) conn() (*nftables.Conn, error) {
	if s.perOperation {
		return openNFT(nftables.WithNetNSFd(netnsFd(s.ns)))
	}
	if s.c == nil {
		c, err := openNFT(nftables.WithNetNSFd(netnsFd(s.ns)), nftables.AsLasting())
		if err != nil {
			return nil, err
		}
		s.c = c
	}
	return s.c, nil
}

// fail drops the connections after an error: they may hold messages
// queued for a transaction that was not sent, or answers not read. The
// next operation opens new ones.
func (s *nftSession) fail() {
	s.close()
}

// close closes the sockets; the session opens new ones if used again.
func (s *nftSession) close() {
	if s.c != nil {
		s.c.CloseLasting()
		s.c = nil
	}
	if s.raw != nil {
		s.raw.Close()
		s.raw = nil
	}
}

// execute sends one request on the raw socket and returns the answer.
func (s *nftSession) execute(m netlink.Message) ([]netlink.Message, error) {
	cfg := &netlink.Config{NetNS: netnsFd(s.ns)}
	if s.perOperation {
		conn, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		return conn.Execute(m)
	}
	if s.raw == nil {
		conn, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
		if err != nil {
			return nil, err
		}
		s.raw = conn
	}
	msgs, err := s.raw.Execute(m)
	if err != nil {
		// The socket may hold the rest of the answer.
		s.raw.Close()
		s.raw = nil
	}
	return msgs, err
}

// generation asks the kernel for the nftables generation of the
// session's network namespace: it changes with every committed
// transaction, anyone's.
func (s *nftSession) generation() (uint32, error) {
	msgs, err := s.execute(netlink.Message{
		Header: netlink.Header{Type: nftMsgType(unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   nfgenmsg(unix.AF_UNSPEC),
	})
	if err != nil {
		return 0, fmt.Errorf("read nftables generation: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type != nftMsgType(unix.NFT_MSG_NEWGEN) || len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, fmt.Errorf("read nftables generation: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, errors.New("read nftables generation: no generation in the kernel's answer")
}

// rules dumps the rules of every chain of the table in one request and
// returns, per chain, each rule's handle and comment.
func (s *nftSession) rules(table string) (map[string][]ruleRef, error) {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_RULE_TABLE, Data: []byte(table + "\x00")}})
	if err != nil {
		return nil, err
	}
	msgs, err := s.execute(netlink.Message{
		Header: netlink.Header{Type: nftMsgType(unix.NFT_MSG_GETRULE), Flags: netlink.Request | netlink.Dump},
		Data:   append(nfgenmsg(unix.NFPROTO_IPV4), attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("list rules of %s: %w", table, err)
	}
	out := map[string][]ruleRef{}
	for _, m := range msgs {
		if m.Header.Type != nftMsgType(unix.NFT_MSG_NEWRULE) || len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, fmt.Errorf("list rules of %s: %w", table, err)
		}
		ad.ByteOrder = binary.BigEndian
		var chain, tbl string
		var r ruleRef
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_RULE_TABLE:
				tbl = ad.String()
			case unix.NFTA_RULE_CHAIN:
				chain = ad.String()
			case unix.NFTA_RULE_HANDLE:
				r.handle = ad.Uint64()
			case unix.NFTA_RULE_USERDATA:
				r.comment, _ = userdata.GetString(ad.Bytes(), userdata.TypeComment)
			}
		}
		if err := ad.Err(); err != nil {
			return nil, fmt.Errorf("list rules of %s: %w", table, err)
		}
		if tbl == table {
			out[chain] = append(out[chain], r)
		}
	}
	return out, nil
}

// netnsFd is how a socket is opened in ns: 0 (where the calling thread
// is) when ns is none or the thread is already there, since entering
// another namespace takes setns, which needs CAP_SYS_ADMIN, which the
// agent's pod does not have; outside tests ns is always where the agent
// runs.
func netnsFd(ns netns.NsHandle) int {
	if !ns.IsOpen() {
		return 0
	}
	here, err := netns.Get()
	if err == nil {
		defer here.Close()
		if here.Equal(ns) {
			return 0
		}
	}
	return int(ns)
}
