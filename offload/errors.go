package offload

import (
	"errors"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Reasons of flotilla_reflection_errors_total.
const (
	errQuota          = "quota"     // the provider's quota refused the pod
	errForbidden      = "forbidden" // its admission or RBAC did
	errInvalid        = "invalid"   // it found the pod invalid
	errUnauthorized   = "unauthorized"
	errUnreachable    = "unreachable" // no answer, or not one about the pod
	errNameTaken      = "name_taken"  // a pod of that name there is not ours
	errUntranslatable = "untranslatable"
	errNotOffloaded   = "not_offloaded"
	errLocal          = "local" // this cluster's API server refused a write
)

// errNotListed: a watch the reconcile needs has not listed yet; it
// queues the pods concerned once it has.
var errNotListed = errors.New("not listed yet")

// retryLater is a wait no watch event ends: the reconcile runs again
// after its backoff.
type retryLater string

func (e retryLater) Error() string { return string(e) }

// providerError is a provider's failure to do what was asked, with the
// reason counted.
type providerError struct {
	reason string
	err    error
}

func (e *providerError) Error() string { return e.err.Error() }

func (e *providerError) Unwrap() error { return e.err }

// classify names what went wrong with a request to a provider.
func classify(err error) string {
	switch {
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
		return errQuota
	case apierrors.IsForbidden(err):
		return errForbidden
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		return errInvalid
	case apierrors.IsUnauthorized(err):
		return errUnauthorized
	}
	return errUnreachable
}

// refused reports whether reason is the provider saying no, which the
// pod's owner should read, rather than not answering.
func refused(reason string) bool {
	return reason == errQuota || reason == errForbidden || reason == errInvalid
}
