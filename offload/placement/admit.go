package placement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/certs"
)

// Bounds of what the webhook reads: together at most
// maxConcurrentReviews × maxReviewBytes (16 MiB) of bodies in memory,
// whoever sends them. A body's length is known before it is read: the
// API server announces it (Content-Length), and a body of unknown length
// (chunked) is refused unread.
const (
	// maxReviewBytes bounds an AdmissionReview's body: the API server's
	// own limit on a request is 3 MiB, and the review wraps the pod once.
	maxReviewBytes = 4 << 20
	// maxConcurrentReviews bounds the reviews read and answered at
	// once; placement answers from memory in well under a millisecond.
	maxConcurrentReviews = 4
	// slotWait is how long a request waits for a slot before it is
	// refused (429): well within the API server's placementTimeout.
	slotWait = 2 * time.Second
	// offloadWait is how long a review waits for the cache to show the
	// NamespaceOffload of a namespace labelled offloaded (the label and
	// the object may reach the webhook in either order); the webhook
	// never asks the API server per request.
	offloadWait = time.Second
)

// Reasons of flotilla_webhook_requests_limited_total.
const (
	limitTooLarge         = "too_large"
	limitUnknownLength    = "unknown_length"
	limitBusy             = "busy"
	limitNoClientCert     = "no_client_certificate"
	limitClientNotAllowed = "client_not_allowed"
)

// ServeHTTP answers the API server's AdmissionReviews (v1).
func (w *Webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(rw, "POST an AdmissionReview (admission.k8s.io/v1)", http.StatusMethodNotAllowed)
		return
	}
	if code, reason, msg := w.admitClient(r); code != 0 {
		w.refuse(rw, code, reason, msg)
		return
	}
	if r.ContentLength < 0 {
		w.refuse(rw, http.StatusLengthRequired, limitUnknownLength, "a body of unknown length (chunked): send its Content-Length, as the API server does")
		return
	}
	if r.ContentLength > maxReviewBytes {
		w.refuse(rw, http.StatusRequestEntityTooLarge, limitTooLarge, fmt.Sprintf("a body of %d bytes, at most %d", r.ContentLength, maxReviewBytes))
		return
	}
	wait := time.NewTimer(slotWait)
	select {
	case w.slots <- struct{}{}:
		wait.Stop()
		defer func() { <-w.slots }()
	case <-wait.C:
		w.refuse(rw, http.StatusTooManyRequests, limitBusy, fmt.Sprintf("%d reviews under way; try again", maxConcurrentReviews))
		return
	case <-r.Context().Done():
		wait.Stop()
		return
	}
	body, err := readBody(r)
	var review admissionv1.AdmissionReview
	if err == nil {
		err = json.Unmarshal(body, &review)
	}
	if err == nil && review.Request == nil {
		err = errors.New("no request in it")
	}
	if err != nil {
		w.requests.WithLabelValues(resultError).Inc()
		http.Error(rw, "placement webhook: read the AdmissionReview: "+err.Error(), http.StatusBadRequest)
		return
	}
	req := review.Request
	resp, result := w.admit(r.Context(), req)
	resp.UID = req.UID
	w.requests.WithLabelValues(result).Inc()
	w.log.Debug("placement admission", "namespace", req.Namespace, "name", podName(req), "result", result)
	out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
	if err != nil {
		http.Error(rw, "placement webhook: "+err.Error(), http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.Write(out)
}

// readBody reads the review into a buffer of the size the client
// announced, at most maxReviewBytes (checked by the caller); the server
// reads no further than that.
func readBody(r *http.Request) ([]byte, error) {
	buf := make([]byte, r.ContentLength)
	if _, err := io.ReadFull(r.Body, buf); err != nil {
		return nil, fmt.Errorf("read %d bytes: %w", r.ContentLength, err)
	}
	return buf, nil
}

// admitClient checks the client's certificate when the webhook requires
// one; a non-zero code refuses the request.
func (w *Webhook) admitClient(r *http.Request) (code int, reason, msg string) {
	if w.clients == nil {
		return 0, "", ""
	}
	leaf, err := w.clients.Verify(r.TLS)
	switch {
	case errors.Is(err, certs.ErrNoClientCertificate):
		return http.StatusUnauthorized, limitNoClientCert, "a client certificate is required: the API server's, given to admission webhooks by an AdmissionConfiguration (docs/offload.md), " +
			"or run the agent with --webhook-client-ca=none where the API server cannot present one"
	case err != nil:
		return http.StatusUnauthorized, limitClientNotAllowed, err.Error()
	}
	cn := leaf.Subject.CommonName
	if len(w.cfg.ClientNames) > 0 && !slices.Contains(w.cfg.ClientNames, cn) {
		return http.StatusForbidden, limitClientNotAllowed, fmt.Sprintf("client certificate %q is not one of %v", cn, w.cfg.ClientNames)
	}
	return 0, "", ""
}

// refuse answers a request refused before its review was read, counts
// it and logs it at most once a minute per reason.
func (w *Webhook) refuse(rw http.ResponseWriter, code int, reason, msg string) {
	w.limited.WithLabelValues(reason).Inc()
	if w.logRefusal(reason) {
		w.log.Warn("placement webhook request refused (logged once a minute per reason; flotilla_webhook_requests_limited_total counts them)", "reason", reason, "detail", msg)
	}
	rw.Header().Set("Connection", "close")
	http.Error(rw, "placement webhook: "+msg, code)
}

// logRefusal says whether a refusal for reason is to be logged: the first
// one, then one a minute.
func (w *Webhook) logRefusal(reason string) bool {
	now := time.Now()
	w.refusedMu.Lock()
	defer w.refusedMu.Unlock()
	if last, ok := w.refusedAt[reason]; ok && now.Sub(last) < time.Minute {
		return false
	}
	w.refusedAt[reason] = now
	return true
}

// podName names the pod of req in logs (a pod being created may only
// have a generateName).
func podName(req *admissionv1.AdmissionRequest) string {
	if req.Name != "" {
		return req.Name
	}
	var m struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if json.Unmarshal(req.Object.Raw, &m) == nil && m.Metadata.GenerateName != "" {
		return m.Metadata.GenerateName + "<generated>"
	}
	return ""
}

// admit places the pod of req and says what became of it.
func (w *Webhook) admit(ctx context.Context, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, string) {
	allowed := &admissionv1.AdmissionResponse{Allowed: true}
	if req.Kind.Group != "" || req.Kind.Kind != "Pod" || req.Operation != admissionv1.Create || req.SubResource != "" {
		return allowed, resultAdmitted // the configuration sends nothing else
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, "placement webhook: decode the pod: "+err.Error()), resultError
	}
	in, err := w.input(ctx, req.Namespace, &pod)
	if err != nil {
		return denied(http.StatusInternalServerError, metav1.StatusReasonInternalError,
			fmt.Sprintf("placement webhook: %v; the pod was not placed, create it again", err)), resultError
	}
	ops, err := place(in)
	var r *placementRefusal
	switch {
	case errors.As(err, &r):
		return denied(http.StatusForbidden, metav1.StatusReasonForbidden, r.message), resultRefused
	case err != nil:
		return denied(http.StatusInternalServerError, metav1.StatusReasonInternalError, "placement webhook: "+err.Error()), resultError
	case len(ops) == 0:
		return allowed, resultAdmitted
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return denied(http.StatusInternalServerError, metav1.StatusReasonInternalError, "placement webhook: "+err.Error()), resultError
	}
	jsonPatch := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{Allowed: true, Patch: patch, PatchType: &jsonPatch}, resultMutated
}

func denied(code int32, reason metav1.StatusReason, message string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Result: &metav1.Status{
		Status: metav1.StatusFailure, Code: code, Reason: reason, Message: message,
	}}
}

// actingOffload is the acting NamespaceOffload of ns in the cache. The
// namespace is labelled offloaded (or it would not be sent here)
// because a NamespaceOffload is in it, which the cache may not show yet:
// it is read again for up to offloadWait, never from the API server.
func (w *Webhook) actingOffload(ctx context.Context, ns string) (*v1alpha1.NamespaceOffload, error) {
	deadline := time.Now().Add(offloadWait)
	for {
		var offloads v1alpha1.NamespaceOffloadList
		if err := w.cache.List(ctx, &offloads, client.InNamespace(ns)); err != nil {
			return nil, fmt.Errorf("list NamespaceOffloads in %s: %w", ns, err)
		}
		if o := offload.ActingOffload(offloads.Items); o != nil || !time.Now().Before(deadline) {
			return o, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// input gathers what placement needs from the watches: the acting
// NamespaceOffload of ns, the Nodes and the Peers' labels.
func (w *Webhook) input(ctx context.Context, ns string, pod *corev1.Pod) (placementInput, error) {
	in := placementInput{pod: pod, namespace: ns}
	var err error
	if in.offload, err = w.actingOffload(ctx, ns); err != nil || in.offload == nil {
		return in, err
	}
	nodes := metadataListOf(nodeGVK)
	if err := w.cache.List(ctx, nodes, client.UnsafeDisableDeepCopy); err != nil {
		return in, fmt.Errorf("list Nodes: %w", err)
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		in.nodes = append(in.nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}})
	}
	peers := metadataListOf(peerGVK)
	if err := w.cache.List(ctx, peers, client.UnsafeDisableDeepCopy); err != nil {
		return in, fmt.Errorf("list Peers: %w", err)
	}
	in.peerLabels = make(map[string]map[string]string, len(peers.Items))
	for _, p := range peers.Items {
		in.peerLabels[p.Name] = p.Labels
	}
	return in, nil
}
