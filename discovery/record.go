package discovery

import (
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"unicode/utf8"

	"github.com/flotilla-io/flotilla/identity"
)

// Wire layout of a member record, format 2 (all integers big endian):
//
//	0       magic 'F'
//	1       record format version (2)
//	2..3    protocol version
//	4       flags (bit 0: leaving; bit 1: outbound only)
//	5..12   serial
//	13..44  Ed25519 public key
//	45      length of the peering endpoint (0..MaxEndpointLen)
//	        peering endpoint ("host:port", may be empty)
//	        Ed25519 signature (64 bytes) of recordDomain || everything above
//
// The cluster ID is not carried: it is derived from the key, and the
// memberlist name (which every alive message carries anyway) must equal it.
// Every alive message carries the record, so each byte saved here lets
// more of them share a gossip packet (format 1 carried the ID too).
const (
	recordMagic   = 'F'
	recordFormat  = 2
	flagLeaving   = 1 << 0
	flagOutbound  = 1 << 1
	knownFlags    = flagLeaving | flagOutbound
	headerLen     = 13
	recordSigLen  = ed25519.SignatureSize
	recordKeyLen  = ed25519.PublicKeySize
	recordDomain  = "flotilla/member-record/v2\x00"
	metaSizeLimit = 512 // memberlist.MetaMaxSize
)

// MaxEndpointLen bounds the peering endpoint so the largest record stays
// well under memberlist's 512-byte metadata limit.
const MaxEndpointLen = 200

// MaxRecordLen is the size of the largest valid record.
const MaxRecordLen = headerLen + recordKeyLen + 1 + MaxEndpointLen + recordSigLen

// Record is what a cluster says about itself in its gossip metadata. It is
// signed by the cluster's identity key, and the cluster ID is the hash of
// that key, so no member can speak for another.
type Record struct {
	// ClusterID is derived from PublicKey when decoding.
	ClusterID string
	PublicKey ed25519.PublicKey
	// Endpoint is where peering reaches this cluster ("host:port"); empty
	// until the agent knows it.
	Endpoint string
	Protocol uint16
	// Serial grows with every record a cluster issues, across restarts
	// and clock steps (see Config.Serials); a record with a lower serial
	// than one already seen for the same cluster is stale, one with the
	// same serial and other content is refused too.
	Serial uint64
	// Leaving is set in the last record a cluster gossips before it leaves
	// on purpose, so peers can tell a leave from a failure.
	Leaving bool
	// OutboundOnly says that nobody can reach this cluster's gateway
	// first (it is behind NAT): members reach it only through the
	// connections it opens, and its peering endpoint is learned from
	// what it sends.
	OutboundOnly bool
}

// Reasons a record is refused; they label the dropped-records metric.
const (
	ReasonMalformed = "malformed"
	ReasonOversized = "oversized"
	ReasonFormat    = "unknown_format"
	ReasonProtocol  = "unsupported_protocol"
	// ReasonIDMismatch is no longer produced: since record format 2 the
	// cluster ID is derived from the key, and a member whose name is not
	// that ID is refused with ReasonNameMismatch.
	ReasonIDMismatch   = "id_not_from_key"
	ReasonBadSignature = "bad_signature"
	ReasonNameMismatch = "name_mismatch"
	ReasonStale        = "stale"
	// ReasonSerialReused: the serial of the record already accepted from
	// that cluster, with other content. A cluster never issues that (its
	// serial is stored before use); it is a forgery with a stolen key or a
	// replay spliced from two records.
	ReasonSerialReused = "serial_reused"
)

// RecordError says why a record was refused.
type RecordError struct {
	Reason string
	Err    error
}

func (e *RecordError) Error() string { return fmt.Sprintf("member record: %s: %v", e.Reason, e.Err) }
func (e *RecordError) Unwrap() error { return e.Err }

// ReasonOf returns the reason label of err, or ReasonMalformed for errors
// that carry none.
func ReasonOf(err error) string {
	var re *RecordError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ReasonMalformed
}

func refuse(reason, format string, args ...any) error {
	return &RecordError{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// SignRecord encodes r, with its public key and cluster ID taken from id,
// and signs it.
func SignRecord(id identity.Identity, r Record) ([]byte, error) {
	r.PublicKey = id.Public()
	r.ClusterID = id.ClusterID()
	body, err := r.marshalBody()
	if err != nil {
		return nil, err
	}
	return append(body, id.Sign(signedBytes(body))...), nil
}

func (r Record) marshalBody() ([]byte, error) {
	if len(r.PublicKey) != recordKeyLen {
		return nil, fmt.Errorf("encode member record: public key is %d bytes, want %d", len(r.PublicKey), recordKeyLen)
	}
	if err := validateEndpoint(r.Endpoint); err != nil {
		return nil, fmt.Errorf("encode member record: %w", err)
	}
	b := make([]byte, 0, MaxRecordLen)
	b = append(b, recordMagic, recordFormat)
	b = binary.BigEndian.AppendUint16(b, r.Protocol)
	var flags byte
	if r.Leaving {
		flags |= flagLeaving
	}
	if r.OutboundOnly {
		flags |= flagOutbound
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint64(b, r.Serial)
	b = append(b, r.PublicKey...)
	b = append(b, byte(len(r.Endpoint)))
	b = append(b, r.Endpoint...)
	return b, nil
}

func signedBytes(body []byte) []byte {
	return append([]byte(recordDomain), body...)
}

// DecodeRecord parses and verifies a record: the signature must verify
// against the key in it; the cluster ID is derived from that key. It never
// panics; every refusal is a *RecordError.
func DecodeRecord(b []byte) (Record, error) {
	if len(b) > MaxRecordLen {
		return Record{}, refuse(ReasonOversized, "%d bytes, at most %d", len(b), MaxRecordLen)
	}
	if len(b) < headerLen+recordKeyLen+1+recordSigLen {
		return Record{}, refuse(ReasonMalformed, "%d bytes is too short", len(b))
	}
	if b[0] != recordMagic {
		return Record{}, refuse(ReasonMalformed, "bad magic byte %#x", b[0])
	}
	if b[1] != recordFormat {
		return Record{}, refuse(ReasonFormat, "format version %d, this build reads %d", b[1], recordFormat)
	}
	var r Record
	r.Protocol = binary.BigEndian.Uint16(b[2:4])
	flags := b[4]
	if flags&^knownFlags != 0 {
		return Record{}, refuse(ReasonMalformed, "unknown flags %#x", flags)
	}
	r.Leaving = flags&flagLeaving != 0
	r.OutboundOnly = flags&flagOutbound != 0
	r.Serial = binary.BigEndian.Uint64(b[5:13])
	body := b[:len(b)-recordSigLen]
	sig := b[len(b)-recordSigLen:]
	rest := body[headerLen:]
	r.PublicKey = ed25519.PublicKey(append([]byte(nil), rest[:recordKeyLen]...))
	rest = rest[recordKeyLen:]
	epLen := int(rest[0])
	rest = rest[1:]
	if epLen != len(rest) {
		return Record{}, refuse(ReasonMalformed, "endpoint length %d, %d bytes left", epLen, len(rest))
	}
	r.Endpoint = string(rest)
	if err := validateEndpoint(r.Endpoint); err != nil {
		return Record{}, refuse(ReasonMalformed, "%v", err)
	}
	r.ClusterID = identity.ClusterID(r.PublicKey)
	if !ed25519.Verify(r.PublicKey, signedBytes(body), sig) {
		return Record{}, refuse(ReasonBadSignature, "record of %s: %v", r.ClusterID, identity.ErrBadSignature)
	}
	if r.Protocol == 0 {
		return Record{}, refuse(ReasonProtocol, "protocol version 0 of %s", r.ClusterID)
	}
	return r, nil
}

func validateEndpoint(ep string) error {
	if ep == "" {
		return nil
	}
	if len(ep) > MaxEndpointLen {
		return fmt.Errorf("peering endpoint is %d bytes, at most %d", len(ep), MaxEndpointLen)
	}
	if !utf8.ValidString(ep) {
		return fmt.Errorf("peering endpoint %q is not UTF-8", ep)
	}
	for _, c := range ep {
		if c < 0x21 || c == 0x7f {
			return fmt.Errorf("peering endpoint %q has a space or control character", ep)
		}
	}
	host, port, err := net.SplitHostPort(ep)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("peering endpoint %q is not host:port", ep)
	}
	return nil
}
