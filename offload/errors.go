package offload

import (
	"errors"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Reasons of flotilla_reflection_errors_total.
const (
	ErrQuota          = "quota"     // the provider's quota refused the pod
	ErrForbidden      = "forbidden" // its admission or RBAC did
	errInvalid        = "invalid"   // it found the pod invalid
	errUnauthorized   = "unauthorized"
	ErrUnreachable    = "unreachable" // no answer, or not one about the pod
	ErrNameTaken      = "name_taken"  // a pod of that name there is not ours
	ErrUntranslatable = "untranslatable"
	ErrNotOffloaded   = "not_offloaded"
	ErrLocal          = "local" // this cluster's API server refused a write
)

// ErrNotListed: a watch the reconcile needs has not listed yet; it
// queues the pods concerned once it has.
var ErrNotListed = errors.New("not listed yet")

// RetryLater is a wait no watch event ends: the reconcile runs again
// after its backoff.
type RetryLater string

func (e RetryLater) Error() string { return string(e) }

// ProviderError is a provider's failure to do what was asked, with the
// reason counted.
type ProviderError struct {
	Reason string
	Err    error
}

func (e *ProviderError) Error() string { return e.Err.Error() }

func (e *ProviderError) Unwrap() error { return e.Err }

// Classify names what went wrong with a request to a provider.
func Classify(err error) string {
	switch {
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
		return ErrQuota
	case apierrors.IsForbidden(err):
		return ErrForbidden
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		return errInvalid
	case apierrors.IsUnauthorized(err):
		return errUnauthorized
	}
	return ErrUnreachable
}

// Refused reports whether reason is the provider saying no, which the
// pod's owner should read, rather than not answering.
func Refused(reason string) bool {
	return reason == ErrQuota || reason == ErrForbidden || reason == errInvalid
}
