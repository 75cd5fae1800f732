// Package kubernetes is the runtime that runs each sandbox as a pod in one namespace of a
// Kubernetes cluster (client-go). The pod's init container copies the agentbox binary from a
// small guest image into an emptyDir; the main container runs the sandbox's image (a
// reference the cluster resolves) with `agentbox guest` as its entrypoint, hardened (dropped
// capabilities, no privilege escalation, seccomp RuntimeDefault, read-only root, no
// service-account token) under the RuntimeClass of its isolation level. The server reaches the
// agent through the API server: one long-lived pods/exec per sandbox running
// `agentbox guest-tunnel`, a yamux session over its stdin and stdout (package tunnel), which
// works under gVisor's netstack too. A NetworkPolicy denies all ingress and egress of
// agentbox's sandbox pods. Snapshots, pause, metrics and egress are not offered.
package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Runtime names: one runtime per isolation level, sharing the namespace.
const (
	// NameProcess runs pods under the process RuntimeClass (runc).
	NameProcess = "kubernetes"
	// NameKernel runs pods under the kernel RuntimeClass (gVisor).
	NameKernel = "kubernetes-gvisor"
)

// NetworkPolicyName is the policy agentbox makes (if missing) in its namespace: every sandbox
// pod (LabelRole=sandbox) gets no ingress and no egress.
const NetworkPolicyName = "agentbox-sandboxes-deny-all"

// Bounds.
const (
	// probeTimeout bounds New's probe of the cluster.
	probeTimeout = 15 * time.Second
	// listPage and maxListed bound List.
	listPage  = 500
	maxListed = 100000
	// deleteWait bounds how long Delete waits for the kubelet to remove a pod it is stopping
	// before forcing the object away.
	deleteWait = 60 * time.Second
	// watchTimeout is the server-side timeout of one watch (Wait re-watches after it).
	watchTimeout = 5 * time.Minute
	// maxPodJSON bounds a pending pod spec kept in a ConfigMap (Create without Start).
	maxPodJSON = 256 << 10
)

// Config configures one runtime.
type Config struct {
	// Name is NameProcess or NameKernel (the default follows Isolation).
	Name string
	// Isolation is runtime.IsolationProcess (default) or runtime.IsolationKernel.
	Isolation runtime.Isolation
	// Kubeconfig is a kubeconfig file; "" uses the in-cluster config (a server in a pod).
	Kubeconfig string
	// Context is the kubeconfig context ("": its current one).
	Context string
	// RESTConfig, when set, is used instead of Kubeconfig.
	RESTConfig *rest.Config
	// Namespace holds the sandboxes' pods ("default" if empty).
	Namespace string
	// RuntimeClass is the pods' runtimeClassName ("": the cluster's default handler, which
	// must then be the isolation's).
	RuntimeClass string
	// GuestImage is the image whose /agentbox is this server's binary (agentbox
	// kube-guest-image builds it); it must be importable by the nodes or in a registry they
	// reach.
	GuestImage string
	// HostImage is the image a sandbox of image "host" runs ("": image "host" is not offered).
	HostImage string
	// NodeName pins sandbox pods to one node ("": the scheduler places them).
	NodeName string
	// PullNever sets imagePullPolicy Never (images imported into the nodes, no registry).
	PullNever bool
	// Delivery is how the agent gets into pods: DeliveryImageVolume (default) or
	// DeliveryInitContainer.
	Delivery string
	// ProbeOnly makes New only probe the cluster (agentbox doctor): it creates nothing, and the
	// runtime is not available for sandboxes.
	ProbeOnly bool
	// Version is the server's version, recorded on pods.
	Version string
	Logger  *slog.Logger
}

// Runtime runs sandboxes as pods. It implements runtime.Runtime, Runner, Waiter, Adopter and
// Closer.
type Runtime struct {
	cfg  Config
	rest *rest.Config
	api  *client
	http *http.Client
	log  *slog.Logger
	caps runtime.Capabilities

	mu      sync.Mutex
	tunnels map[string]*agentTunnel
	closed  bool
	// placed caches neverPlaceable's answer per pod (uid) for placeEvery.
	placed map[types.UID]placeAnswer
}

var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Runner  = (*Runtime)(nil)
	_ runtime.Waiter  = (*Runtime)(nil)
	_ runtime.Adopter = (*Runtime)(nil)
	_ runtime.Closer  = (*Runtime)(nil)
)

// Hardening lists what every sandbox pod gets, for Capabilities.Hardening.
var Hardening = []string{
	"pod:runtime-class", "caps:drop-all+minimal", "no-new-privileges", "seccomp:runtime-default",
	"rootfs:read-only", "no-service-account-token", "no-service-links",
	"cgroup:cpu,memory(requests=limits)", "disk:emptydir-size-limit(kubelet-eviction)",
	"tmp:memory-emptydir", "networkpolicy:deny-all-ingress-egress", "agent-peer:pid1", "rlimits:fsize",
}

// RESTConfigFor loads a client configuration: kubeconfig (with its context) or, for "", the
// in-cluster configuration.
func RESTConfigFor(kubeconfig, context string) (*rest.Config, error) {
	if kubeconfig == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kube-config given and not in a pod: %w", err)
		}
		return c, nil
	}
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}
	c, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return c, nil
}

// New connects to the cluster and probes it (the server's version, the namespace, the
// RuntimeClass, the NetworkPolicy, which it creates if missing). A cluster it cannot use
// gives an unavailable runtime with the reason, not an error; an error is a bad Config.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if cfg.Isolation == "" {
		cfg.Isolation = runtime.IsolationProcess
	}
	if cfg.Isolation != runtime.IsolationProcess && cfg.Isolation != runtime.IsolationKernel {
		return nil, fmt.Errorf("kubernetes runtime: isolation %q must be process or kernel", cfg.Isolation)
	}
	if cfg.Name == "" {
		cfg.Name = NameProcess
		if cfg.Isolation == runtime.IsolationKernel {
			cfg.Name = NameKernel
		}
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "default"
	}
	switch cfg.Delivery {
	case "":
		cfg.Delivery = DeliveryImageVolume
	case DeliveryImageVolume, DeliveryInitContainer:
	default:
		return nil, fmt.Errorf("kubernetes runtime: guest delivery %q must be %s or %s", cfg.Delivery, DeliveryImageVolume, DeliveryInitContainer)
	}
	if cfg.GuestImage == "" {
		return nil, errors.New("kubernetes runtime: no guest image configured (agentbox kube-guest-image builds one)")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Runtime{cfg: cfg, log: log.With("runtime", cfg.Name), tunnels: map[string]*agentTunnel{}}
	images := []string{runtime.ImageRef}
	if cfg.HostImage != "" {
		images = append([]string{"host"}, images...)
	}
	hardening := slices.Clone(Hardening)
	if cfg.Isolation == runtime.IsolationKernel {
		// runsc applies an OCI seccomp profile inside the sandbox only with --oci-seccomp:
		// the workload's system calls meet gVisor's sentry, which runs under its own filter.
		hardening = slices.DeleteFunc(hardening, func(h string) bool { return h == "seccomp:runtime-default" })
		hardening = append(hardening, "seccomp:gvisor-sentry")
	}
	r.caps = runtime.Capabilities{Name: cfg.Name, Isolation: cfg.Isolation, Images: images,
		NetworkModes: []string{runtime.NetworkNone}, Hardening: hardening,
		EgressReason: "sandbox pods have no network (a deny-all NetworkPolicy); egress through the server's proxy is not wired for pods yet"}
	rc := cfg.RESTConfig
	if rc == nil {
		var err error
		if rc, err = RESTConfigFor(cfg.Kubeconfig, cfg.Context); err != nil {
			r.caps.Reason = err.Error()
			return r, nil
		}
	}
	rc = rest.CopyConfig(rc)
	if rc.UserAgent == "" {
		rc.UserAgent = "agentbox/" + cfg.Version
	}
	// Every sandbox's dial may need a GET: a rate limit well above client-go's default 5/s.
	rc.QPS, rc.Burst = 100, 200
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes runtime: %w", err)
	}
	api, err := newClient(rc, hc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes runtime: %w", err)
	}
	r.rest, r.api, r.http = rc, api, hc
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	info, err := r.Probe(pctx)
	r.caps.Version = info.ServerVersion
	if info.RuntimeClassHandler != "" {
		r.caps.Version += " runtimeclass " + cfg.RuntimeClass + " (handler " + info.RuntimeClassHandler + ")"
	}
	if err != nil {
		r.caps.Reason = err.Error()
		return r, nil
	}
	if cfg.ProbeOnly {
		return r, nil // nothing created; not Available: it is not for sandboxes
	}
	if err := r.ensureNetworkPolicy(pctx); err != nil {
		r.caps.Reason = err.Error()
		return r, nil
	}
	r.caps.Available = true
	return r, nil
}

// ProbeInfo is what Probe found.
type ProbeInfo struct {
	ServerVersion string
	// Namespace is whether the namespace exists.
	Namespace bool
	// RuntimeClassHandler is the RuntimeClass's handler ("" with no RuntimeClass configured).
	RuntimeClassHandler string
	// RuntimeClasses are the cluster's RuntimeClass names (for doctor).
	RuntimeClasses []string
	// NetworkPolicy is whether the namespace has the deny-all policy.
	NetworkPolicy bool
}

// Probe asks the cluster what the runtime needs: its version, the namespace, the RuntimeClass.
func (r *Runtime) Probe(ctx context.Context) (ProbeInfo, error) {
	var info ProbeInfo
	if r.api == nil {
		return info, errors.New(r.caps.Reason)
	}
	v, err := r.api.serverVersion(ctx)
	if err != nil {
		return info, fmt.Errorf("the cluster's API server at %s does not answer: %w", r.rest.Host, err)
	}
	info.ServerVersion = v.GitVersion
	var errs []error
	if _, err := r.api.namespaces().Get(ctx, r.cfg.Namespace, metav1.GetOptions{}); err != nil {
		errs = append(errs, fmt.Errorf("namespace %s: %w", r.cfg.Namespace, err))
	} else {
		info.Namespace = true
	}
	rcs, err := r.api.runtimeClasses().List(ctx, metav1.ListOptions{Limit: 200})
	if err == nil {
		for _, c := range rcs.Items {
			info.RuntimeClasses = append(info.RuntimeClasses, c.Name)
		}
	}
	if r.cfg.RuntimeClass != "" {
		c, err := r.api.runtimeClasses().Get(ctx, r.cfg.RuntimeClass, metav1.GetOptions{})
		if err != nil {
			errs = append(errs, fmt.Errorf("RuntimeClass %q (for %s isolation): %w", r.cfg.RuntimeClass, r.cfg.Isolation, err))
		} else {
			info.RuntimeClassHandler = c.Handler
		}
	}
	if info.Namespace {
		_, err := r.api.networkPolicies(r.cfg.Namespace).Get(ctx, NetworkPolicyName, metav1.GetOptions{})
		info.NetworkPolicy = err == nil
	}
	return info, errors.Join(errs...)
}

// ensureNetworkPolicy creates the deny-all policy over agentbox's sandbox pods if it is missing.
func (r *Runtime) ensureNetworkPolicy(ctx context.Context) error {
	want := DenyAllPolicy(r.cfg.Namespace)
	np := r.api.networkPolicies(r.cfg.Namespace)
	_, err := np.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = np.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
		if err == nil {
			r.log.Info("created the sandboxes' deny-all NetworkPolicy", "namespace", r.cfg.Namespace, "name", want.Name)
		}
	}
	if err != nil {
		return fmt.Errorf("NetworkPolicy %s/%s (no network for sandbox pods): %w", r.cfg.Namespace, want.Name, err)
	}
	return nil
}

// DenyAllPolicy is the NetworkPolicy that gives every agentbox sandbox pod of namespace ns no
// ingress and no egress.
func DenyAllPolicy(ns string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: NetworkPolicyName, Namespace: ns, Labels: map[string]string{LabelManagedBy: managedBy}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: managedBy, LabelRole: roleSB}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
}

// Name is the runtime's name.
func (r *Runtime) Name() string { return r.cfg.Name }

// Namespace is the namespace of its pods.
func (r *Runtime) Namespace() string { return r.cfg.Namespace }

// Capabilities is what New found.
func (r *Runtime) Capabilities() runtime.Capabilities {
	c := r.caps
	c.Images, c.NetworkModes, c.Hardening = slices.Clone(c.Images), slices.Clone(c.NetworkModes), slices.Clone(c.Hardening)
	return c
}

func (r *Runtime) usable() error {
	if !r.caps.Available {
		return errcode.New(errcode.RuntimeUnavailable, "runtime %s is not usable: %s", r.cfg.Name, r.caps.Reason)
	}
	return nil
}

// selector is the label selector of this runtime's objects.
func (r *Runtime) selector() string {
	return LabelManagedBy + "=" + managedBy + "," + LabelRole + "=" + roleSB + "," + LabelRuntime + "=" + r.cfg.Name
}

// mine reports whether obj's labels say it is this runtime's sandbox id.
func (r *Runtime) mine(meta metav1.ObjectMeta, id string) bool {
	l := meta.Labels
	return l[LabelManagedBy] == managedBy && l[LabelRole] == roleSB && l[LabelRuntime] == r.cfg.Name && l[LabelSandbox] == id
}

// podFor validates spec and builds its pod.
func (r *Runtime) podFor(spec runtime.Spec) (*corev1.Pod, error) {
	if err := r.usable(); err != nil {
		return nil, err
	}
	if err := runtime.CheckNetwork(spec.Network, r.caps.NetworkModes); err != nil {
		return nil, err
	}
	if spec.Rootfs != nil || spec.Snapshot != nil {
		return nil, errcode.New(errcode.InvalidArgument, "runtime %s takes an image reference the cluster pulls, not unpacked layers or a snapshot", r.cfg.Name)
	}
	img := spec.Image
	if img == "" || img == "host" {
		if r.cfg.HostImage == "" {
			return nil, errcode.New(errcode.InvalidArgument, "image %q is not available on runtime %s (it runs image references the cluster resolves; the server sets no --kube-host-image)", "host", r.cfg.Name)
		}
		img = r.cfg.HostImage
	}
	for k, v := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, errcode.New(errcode.InvalidArgument, "environment variable %q: names must be non-empty without '=' or NUL, values without NUL", k)
		}
	}
	inst, err := newInstance()
	if err != nil {
		return nil, err
	}
	return buildPod(podInput{ID: spec.ID, Namespace: r.cfg.Namespace, Runtime: r.cfg.Name, Instance: inst, Version: r.cfg.Version,
		Image: img, GuestImage: r.cfg.GuestImage, RuntimeClass: r.cfg.RuntimeClass, NodeName: r.cfg.NodeName,
		CPU: spec.CPU, MemoryMB: spec.MemoryMB, DiskMB: spec.DiskMB, Env: spec.Env, PullNever: r.cfg.PullNever, Delivery: r.cfg.Delivery}), nil
}

func newInstance() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// apiErr makes an API error typed: a conflict, a refusal (quota, admission) or anything else.
func apiErr(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	if _, ok := errcode.As(err); ok {
		return err
	}
	switch {
	case apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err):
		return errcode.Wrap(errcode.Conflict, err, format+": %s", append(args, apierrors.ReasonForError(err))...)
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		return errcode.Wrap(errcode.InvalidArgument, err, format+": the cluster refused it: %v", append(args, err)...)
	case apierrors.IsForbidden(err):
		return errcode.Wrap(errcode.RuntimeUnavailable, err, format+": the cluster refused it: %v", append(args, err)...)
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// Run creates the sandbox's pod (Create and Start in one step).
func (r *Runtime) Run(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	pod, err := r.podFor(spec)
	if err != nil {
		return "", err
	}
	if err := r.createPod(ctx, pod); err != nil {
		return "", err
	}
	return runtime.Handle(pod.Annotations[AnnotationInstance]), nil
}

func (r *Runtime) createPod(ctx context.Context, pod *corev1.Pod) error {
	_, err := r.api.pods(r.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) && !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
		// An answer lost on the way (a timeout) may hide a pod that was made: leave nothing.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_ = r.deletePod(dctx, pod.Name, types.UID(""), pod.Annotations[AnnotationInstance])
		cancel()
	}
	return apiErr(err, "create pod %s/%s", r.cfg.Namespace, pod.Name)
}

// Create keeps the sandbox's pod, not yet made, in a ConfigMap of the same name (a pod cannot
// be created without starting); Start makes the pod from it.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	pod, err := r.podFor(spec)
	if err != nil {
		return "", err
	}
	raw, err := encodePod(pod)
	if err != nil {
		return "", err
	}
	if len(raw) > maxPodJSON {
		return "", errcode.New(errcode.InvalidArgument, "sandbox %s's pod is %d bytes; at most %d are allowed (fewer or shorter env)", spec.ID, len(raw), maxPodJSON)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: spec.ID, Namespace: r.cfg.Namespace, Labels: maps.Clone(pod.Labels), Annotations: maps.Clone(pod.Annotations)},
		Data:       map[string]string{"pod.json": string(raw)},
	}
	if _, err := r.api.configMaps(r.cfg.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return "", apiErr(err, "create sandbox %s", spec.ID)
	}
	return runtime.Handle(pod.Annotations[AnnotationInstance]), nil
}

// Start makes the pod Create kept, then forgets the kept spec.
func (r *Runtime) Start(ctx context.Context, id string) error {
	if err := r.usable(); err != nil {
		return err
	}
	cms := r.api.configMaps(r.cfg.Namespace)
	cm, err := cms.Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && !r.mine(cm.ObjectMeta, id)) {
		if p, perr := r.getPod(ctx, id); perr == nil && p != nil {
			return nil // started already
		}
		return errcode.New(errcode.SandboxNotFound, "sandbox %s was not created on runtime %s", id, r.cfg.Name)
	}
	if err != nil {
		return apiErr(err, "start sandbox %s", id)
	}
	pod, err := decodePod([]byte(cm.Data["pod.json"]))
	if err != nil {
		return fmt.Errorf("start sandbox %s: its kept pod spec: %w", id, err)
	}
	if err := r.createPod(ctx, pod); err != nil && !errcode.Is(err, errcode.Conflict) {
		return err
	}
	if err := cms.Delete(ctx, id, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cm.UID}}); err != nil && !apierrors.IsNotFound(err) {
		return apiErr(err, "start sandbox %s: remove its kept spec", id)
	}
	return nil
}

// getPod returns this runtime's pod of sandbox id, or nil.
func (r *Runtime) getPod(ctx context.Context, id string) (*corev1.Pod, error) {
	p, err := r.api.pods(r.cfg.Namespace).Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, apiErr(err, "get pod %s/%s", r.cfg.Namespace, id)
	}
	if !r.mine(p.ObjectMeta, id) {
		return nil, nil // someone else's pod of that name: not ours to see
	}
	return p, nil
}

// getKept returns the ConfigMap Create kept for sandbox id, or nil.
func (r *Runtime) getKept(ctx context.Context, id string) (*corev1.ConfigMap, error) {
	cm, err := r.api.configMaps(r.cfg.Namespace).Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, apiErr(err, "get configmap %s/%s", r.cfg.Namespace, id)
	}
	if !r.mine(cm.ObjectMeta, id) {
		return nil, nil
	}
	return cm, nil
}

// podStatus maps a pod to the contract's statuses: Pending is created (its agent has not
// started), Running is running unless the sandbox's container has exited, and a pod that has
// finished or is being deleted is stopped.
func podStatus(p *corev1.Pod) runtime.Status {
	if p.DeletionTimestamp != nil {
		return runtime.StatusStopped
	}
	switch p.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		return runtime.StatusStopped
	case corev1.PodRunning:
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == ContainerName && cs.State.Terminated != nil {
				return runtime.StatusStopped
			}
		}
		return runtime.StatusRunning
	case corev1.PodPending:
		if p.Spec.ActiveDeadlineSeconds != nil {
			return runtime.StatusStopped // stopped before it ran
		}
		return runtime.StatusCreated
	}
	return runtime.StatusRunning // Unknown: the node is unreachable, the pod may run on
}

// State reports the pod's status; a kept (created, not started) spec is created.
func (r *Runtime) State(ctx context.Context, id string) (runtime.Status, error) {
	p, err := r.getPod(ctx, id)
	if err != nil {
		return "", err
	}
	if p != nil {
		return podStatus(p), nil
	}
	cm, err := r.getKept(ctx, id)
	if err != nil {
		return "", err
	}
	if cm != nil {
		return runtime.StatusCreated, nil
	}
	return runtime.StatusAbsent, nil
}

// Stop kills the pod's containers and waits until they are gone: it sets the pod's
// activeDeadlineSeconds to 1, so that the kubelet kills them (SIGTERM, SIGKILL after the
// 2 s grace) and marks the pod Failed; the pod stays, stopped, until Delete.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	r.dropTunnel(id)
	p, err := r.getPod(ctx, id)
	if err != nil || p == nil {
		return err
	}
	if podDone(p) {
		return nil
	}
	if p.Spec.ActiveDeadlineSeconds == nil || *p.Spec.ActiveDeadlineSeconds != 1 {
		patch := []byte(`{"spec":{"activeDeadlineSeconds":1}}`)
		if _, err := r.api.pods(r.cfg.Namespace).Patch(ctx, id, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return apiErr(err, "stop sandbox %s", id)
		}
	}
	if p.Spec.NodeName == "" && p.Status.Phase == corev1.PodPending {
		return nil // never scheduled: no process to wait for (it fails on its node, if ever)
	}
	return r.waitDone(ctx, id, true)
}

// podDone reports whether every container of the pod has finished (or never ran): the
// kubelet reports the phase once it has killed them.
func podDone(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running != nil {
			return false
		}
	}
	return true
}

// waitDone blocks until pod id is deleted or done (strict: every container finished and the
// pod's phase final; else: podStatus says stopped, e.g. its sandbox container exited), or ctx
// ends.
func (r *Runtime) waitDone(ctx context.Context, id string, strict bool) error {
	pods := r.api.pods(r.cfg.Namespace)
	for {
		list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", id).String()})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return apiErr(err, "watch sandbox %s", id)
		}
		if len(list.Items) == 0 || !r.mine(list.Items[0].ObjectMeta, id) {
			return nil
		}
		if p := &list.Items[0]; podDone(p) || (!strict && podStatus(p) == runtime.StatusStopped) {
			return nil
		}
		w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", id).String(),
			ResourceVersion: list.ResourceVersion, TimeoutSeconds: ptr(int64(watchTimeout / time.Second))})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return apiErr(err, "watch sandbox %s", id)
		}
		done, err := func() (bool, error) {
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return false, ctx.Err()
				case ev, ok := <-w.ResultChan():
					if !ok {
						return false, nil // the watch ended: list and watch again
					}
					switch ev.Type {
					case watch.Deleted:
						return true, nil
					case watch.Error:
						return false, nil
					}
					if p, ok := ev.Object.(*corev1.Pod); ok && (podDone(p) || (!strict && podStatus(p) == runtime.StatusStopped)) {
						return true, nil
					}
				}
			}
		}()
		if err != nil || done {
			return err
		}
		select { // a watch that ends at once must not spin
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Wait blocks until the sandbox's agent has exited (its container terminated, the pod
// finished or deleted) or ctx ends. A sandbox kept by Create waits for its pod.
func (r *Runtime) Wait(ctx context.Context, id string) error {
	for {
		p, err := r.getPod(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if p != nil {
			return r.waitDone(ctx, id, false)
		}
		cm, err := r.getKept(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if cm == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// Adopt checks that the pod is the one h names (its instance annotation) and runs.
func (r *Runtime) Adopt(ctx context.Context, id string, h runtime.Handle) error {
	p, err := r.getPod(ctx, id)
	if err != nil {
		return err
	}
	if p == nil {
		cm, err := r.getKept(ctx, id)
		if err != nil {
			return err
		}
		if cm == nil {
			return errcode.New(errcode.SandboxNotFound, "sandbox %s has no pod in namespace %s", id, r.cfg.Namespace)
		}
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s was created but never started", id)
	}
	if h != "" && p.Annotations[AnnotationInstance] != string(h) {
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s's pod is instance %s, not %s (it was re-created)", id, p.Annotations[AnnotationInstance], h)
	}
	if st := podStatus(p); st != runtime.StatusRunning && st != runtime.StatusCreated {
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s's pod has stopped (phase %s)", id, p.Status.Phase)
	}
	return nil
}

// Delete removes the pod (waiting, up to deleteWait, for the kubelet to stop its containers)
// and any kept spec; an absent sandbox is nil.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	r.dropTunnel(id)
	if r.api == nil {
		return nil
	}
	err := r.api.configMaps(r.cfg.Namespace).Delete(ctx, id, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return apiErr(err, "delete sandbox %s", id)
	}
	p, err := r.getPod(ctx, id)
	if err != nil || p == nil {
		return err
	}
	return r.deletePod(ctx, id, p.UID, "")
}

// deletePod deletes pod id (of uid, if given, or instance inst) and waits until it is gone.
func (r *Runtime) deletePod(ctx context.Context, id string, uid types.UID, inst string) error {
	pods := r.api.pods(r.cfg.Namespace)
	p, err := pods.Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return apiErr(err, "delete sandbox %s", id)
	}
	if (uid != "" && p.UID != uid) || (inst != "" && p.Annotations[AnnotationInstance] != inst) || !r.mine(p.ObjectMeta, id) {
		return nil
	}
	grace := int64(terminationGrace)
	if podDone(p) || p.Spec.NodeName == "" {
		grace = 0 // nothing runs: the object can go at once
	}
	opts := metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &p.UID}}
	if err := pods.Delete(ctx, id, opts); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return apiErr(err, "delete sandbox %s", id)
	}
	if grace == 0 {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, deleteWait)
	defer cancel()
	for {
		q, err := pods.Get(wctx, id, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && q.UID != p.UID) {
			return nil
		}
		if err == nil && podDone(q) {
			// The kubelet has stopped every container: let the object go now.
			zero := int64(0)
			_ = pods.Delete(wctx, id, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &p.UID}})
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The kubelet did not confirm (a node gone): force the object away.
			zero := int64(0)
			err := pods.Delete(ctx, id, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &p.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return apiErr(err, "delete sandbox %s", id)
			}
			r.log.Warn("pod deleted without the kubelet's confirmation", "sandbox_id", id)
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// List returns the ids of this runtime's pods and kept specs in the namespace.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	if r.api == nil {
		return nil, nil
	}
	seen := map[string]bool{}
	opts := metav1.ListOptions{LabelSelector: r.selector(), Limit: listPage}
	for {
		pods, err := r.api.pods(r.cfg.Namespace).List(ctx, opts)
		if err != nil {
			return nil, apiErr(err, "list pods in %s", r.cfg.Namespace)
		}
		for _, p := range pods.Items {
			if id := p.Labels[LabelSandbox]; id == p.Name {
				seen[id] = true
			}
		}
		if opts.Continue = pods.Continue; opts.Continue == "" || len(seen) >= maxListed {
			break
		}
	}
	opts.Continue = ""
	for {
		cms, err := r.api.configMaps(r.cfg.Namespace).List(ctx, opts)
		if err != nil {
			return nil, apiErr(err, "list configmaps in %s", r.cfg.Namespace)
		}
		for _, c := range cms.Items {
			if id := c.Labels[LabelSandbox]; id == c.Name {
				seen[id] = true
			}
		}
		if opts.Continue = cms.Continue; opts.Continue == "" || len(seen) >= maxListed {
			break
		}
	}
	return slices.Sorted(maps.Keys(seen)), nil
}

// Close ends every tunnel; the pods run on for a restarted server to adopt.
func (r *Runtime) Close(context.Context) error {
	r.mu.Lock()
	r.closed = true
	ts := r.tunnels
	r.tunnels = map[string]*agentTunnel{}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, t := range ts {
		wg.Go(t.close) // each waits up to closeGrace for its exec to end
	}
	wg.Wait()
	if r.http != nil {
		utilnet.CloseIdleConnectionsFor(r.http.Transport)
	}
	return nil
}
