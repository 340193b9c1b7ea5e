package placement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
)

// maxReviewBytes bounds an AdmissionReview's body: the API server's own
// limit on a request is 3 MiB, and the review wraps the pod once.
const maxReviewBytes = 8 << 20

// ServeHTTP answers the API server's AdmissionReviews (v1).
func (w *Webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(rw, "POST an AdmissionReview (admission.k8s.io/v1)", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, maxReviewBytes))
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

// input gathers what placement needs from the watches: the acting
// NamespaceOffload of ns, the Nodes and the Peers' labels.
func (w *Webhook) input(ctx context.Context, ns string, pod *corev1.Pod) (placementInput, error) {
	in := placementInput{pod: pod, namespace: ns}
	var offloads v1alpha1.NamespaceOffloadList
	if err := w.cache.List(ctx, &offloads, client.InNamespace(ns)); err != nil {
		return in, fmt.Errorf("list NamespaceOffloads in %s: %w", ns, err)
	}
	in.offload = offload.ActingOffload(offloads.Items)
	if in.offload == nil {
		// The namespace is labelled offloaded (or it would not be sent
		// here) because a NamespaceOffload is in it: this cache may not
		// have seen it yet.
		if err := w.live.List(ctx, &offloads, client.InNamespace(ns)); err != nil {
			return in, fmt.Errorf("list NamespaceOffloads in %s: %w", ns, err)
		}
		in.offload = offload.ActingOffload(offloads.Items)
	}
	if in.offload == nil {
		return in, nil
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
