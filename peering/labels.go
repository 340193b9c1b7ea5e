package peering

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// MaxLabels is how many labels a cluster announces at most, and
// MaxLabelsSize how many bytes their keys and values hold together: with
// the largest grant and the most networks, a statement still fits in a
// message (TestLargestGrantFitsAStatement).
const (
	MaxLabels     = 64
	MaxLabelsSize = 4 << 10
)

// ReservedLabelDomain is the label domain of flotilla's own labels (and
// every subdomain of it): a cluster may not announce labels in it, which
// would pass for what the agent says about a Peer.
const ReservedLabelDomain = "flotilla.io"

// The syntax of Kubernetes label keys and values, written here so the
// negotiation imports nothing of Kubernetes.
var (
	labelName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsLabel  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

const (
	maxLabelName   = 63
	maxLabelPrefix = 253
)

// CheckLabels checks the labels a cluster announces: at most MaxLabels of
// MaxLabelsSize bytes, keys and values as Kubernetes has them, no key in
// ReservedLabelDomain.
func CheckLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return fmt.Errorf("%d labels, over %d", len(labels), MaxLabels)
	}
	// In key order, so the same labels always give the same error.
	keys := make([]string, 0, len(labels))
	size := 0
	for k, v := range labels {
		keys = append(keys, k)
		size += len(k) + len(v)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if err := CheckLabel(k, labels[k]); err != nil {
			return err
		}
	}
	if size > MaxLabelsSize {
		return fmt.Errorf("labels of %d bytes (keys and values), over %d", size, MaxLabelsSize)
	}
	return nil
}

// CheckLabel checks one label a cluster announces.
func CheckLabel(key, value string) error {
	if err := checkLabelKey(key); err != nil {
		return fmt.Errorf("label key %q: %w", key, err)
	}
	if value != "" {
		if err := checkLabelName(value); err != nil {
			return fmt.Errorf("label %s: value %q: %w", key, value, err)
		}
	}
	return nil
}

func checkLabelKey(key string) error {
	prefix, name, found := strings.Cut(key, "/")
	if !found {
		return checkLabelName(key)
	}
	if err := checkLabelName(name); err != nil {
		return fmt.Errorf("name %q: %w", name, err)
	}
	if err := checkDNSSubdomain(prefix); err != nil {
		return fmt.Errorf("prefix %q: %w", prefix, err)
	}
	if prefix == ReservedLabelDomain || strings.HasSuffix(prefix, "."+ReservedLabelDomain) {
		return fmt.Errorf("the prefix %s/ is flotilla's own; use a domain of yours", prefix)
	}
	return nil
}

// checkLabelName checks a label key's name, or a value, that is not empty.
func checkLabelName(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > maxLabelName:
		return fmt.Errorf("%d characters, over %d", len(s), maxLabelName)
	case !labelName.MatchString(s):
		return errors.New("want letters, digits, '-', '_' and '.', starting and ending with a letter or digit")
	}
	return nil
}

func checkDNSSubdomain(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > maxLabelPrefix:
		return fmt.Errorf("%d characters, over %d", len(s), maxLabelPrefix)
	}
	for part := range strings.SplitSeq(s, ".") {
		if !dnsLabel.MatchString(part) {
			return errors.New("want a DNS subdomain: lower-case letters, digits, '-' and '.', each part starting and ending with a letter or digit")
		}
	}
	return nil
}
