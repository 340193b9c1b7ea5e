package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	batchv1client "k8s.io/client-go/kubernetes/typed/batch/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/version"
)

// releaseImage is the image of this CLI's release (latest for a
// development build).
func releaseImage() string {
	tag := version.Version
	if tag == "" || tag == "dev" {
		tag = "latest"
	}
	return "ghcr.io/flotilla-io/flotilla:" + tag
}

// cleanupJob is `flotilla cleanup --node`: the same cleanup, run by a Job
// on that node with the user's rights instead of a root shell there.
type cleanupJob struct {
	cluster   *clusterRef
	node      string
	namespace string
	image     string
	wait      time.Duration
}

// run creates the Job, waits for its pod to finish, prints its log and
// deletes the Job with its pod, whatever the outcome.
func (j cleanupJob) run(ctx context.Context, stdout io.Writer, cleanupArgs []string) error {
	cfg, _, err := j.cluster.restConfig()
	if err != nil {
		return err
	}
	jobs, err := batchv1client.NewForConfig(cfg)
	if err != nil {
		return err
	}
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if _, err := core.Nodes().Get(ctx, j.node, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("node %s: %w (kubectl get nodes lists them; the gateway is the one labelled flotilla.io/gateway=true, or was)", j.node, err)
	}
	job, err := jobs.Jobs(j.namespace).Create(ctx, j.job(cleanupArgs), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create the cleanup Job in %s: %w", j.namespace, err)
	}
	fmt.Fprintf(stdout, "job %s/%s: cleanup on node %s with %s\n", job.Namespace, job.Name, j.node, j.image)
	defer func() {
		// A context of its own: the Job goes even when ctx ended.
		del, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		background := metav1.DeletePropagationBackground
		if err := jobs.Jobs(job.Namespace).Delete(del, job.Name, metav1.DeleteOptions{PropagationPolicy: &background}); err != nil && !apierrors.IsNotFound(err) {
			fmt.Fprintf(stdout, "job %s/%s not deleted: %v; delete it with kubectl -n %s delete job %s\n", job.Namespace, job.Name, err, job.Namespace, job.Name)
		}
	}()
	pod, err := j.waitPod(ctx, core, job)
	if pod != nil {
		logs, lerr := core.Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if lerr == nil {
			stdout.Write(logs)
		}
	}
	return err
}

// waitPod waits until the Job's pod has finished; an error says how it
// failed or what it waits for.
func (j cleanupJob) waitPod(ctx context.Context, core corev1client.CoreV1Interface, job *batchv1.Job) (*corev1.Pod, error) {
	var last *corev1.Pod
	var why string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, j.wait, true, func(ctx context.Context) (bool, error) {
		pods, err := core.Pods(job.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/controller-uid=" + string(job.UID)})
		if err != nil {
			return false, fmt.Errorf("list the Job's pods: %w", err)
		}
		if len(pods.Items) == 0 {
			why = "no pod yet"
			return false, nil
		}
		last = &pods.Items[0]
		switch last.Status.Phase {
		case corev1.PodSucceeded:
			return true, nil
		case corev1.PodFailed:
			return false, fmt.Errorf("the cleanup pod %s failed on %s; its log is above", last.Name, j.node)
		}
		why = "pod " + last.Name + " " + string(last.Status.Phase) + waiting(last)
		return false, nil
	})
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !wait.Interrupted(err) {
		return last, err
	}
	if err != nil {
		return last, fmt.Errorf("the cleanup Job did not finish within %s (%s); give --wait more, or see kubectl -n %s describe job %s", j.wait, why, job.Namespace, job.Name)
	}
	return last, nil
}

// waiting names why a pod's container waits, if it does.
func waiting(p *corev1.Pod) string {
	for _, s := range p.Status.ContainerStatuses {
		if w := s.State.Waiting; w != nil {
			return ": " + w.Reason + " " + w.Message
		}
	}
	return ""
}

func (j cleanupJob) job(args []string) *batchv1.Job {
	labels := map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue, "app.kubernetes.io/name": "flotilla", "app.kubernetes.io/component": "cleanup"}
	name := "flotilla-cleanup-" + strings.ToLower(j.node)
	if len(name) > 52 { // a Job's pods add a suffix to its name, within 63
		name = name[:52]
	}
	never, zero := int32(0), int64(0)
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{GenerateName: strings.TrimSuffix(name, "-") + "-", Namespace: j.namespace, Labels: labels},
		Spec: batchv1.JobSpec{
			BackoffLimit: &never,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeName:                      j.node,
					HostNetwork:                   true,
					RestartPolicy:                 corev1.RestartPolicyNever,
					AutomountServiceAccountToken:  new(bool),
					TerminationGracePeriodSeconds: &zero,
					Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name:  "cleanup",
						Image: j.image,
						Args:  append([]string{"cleanup"}, args...),
						SecurityContext: &corev1.SecurityContext{
							Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN"}},
						},
					}},
				},
			},
		},
	}
}
