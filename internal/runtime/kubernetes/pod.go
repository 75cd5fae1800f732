package kubernetes

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentbox/agentbox/internal/runtime/kubernetes/podpath"
	"github.com/agentbox/agentbox/internal/tmpfs"
)

// Labels and annotations on everything agentbox makes in the namespace.
const (
	// LabelManagedBy is app.kubernetes.io/managed-by=agentbox on every object agentbox made.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "agentbox"
	// LabelRole tells sandbox pods (and their pending specs) from anything else agentbox makes.
	LabelRole = "agentbox.dev/role"
	roleSB    = "sandbox"
	// LabelSandbox is the sandbox's id (List reads it; the pod's name is the id too).
	LabelSandbox = "agentbox.dev/sandbox"
	// LabelRuntime is the runtime's name: each runtime lists and sweeps only its own pods.
	LabelRuntime = "agentbox.dev/runtime"
	// AnnotationInstance is the sandbox's Handle: a random nonce per Create/Run, so that a pod
	// re-created under the same id is told from its predecessor.
	AnnotationInstance = "agentbox.dev/instance"
	// AnnotationVersion is the agentbox version that made the pod.
	AnnotationVersion = "agentbox.dev/version"
)

// Paths inside a sandbox's pod (the same as the local runtimes').
const (
	guestBinDir     = podpath.BinDir
	GuestBinaryPath = podpath.Binary
	GuestRunDir     = podpath.RunDir
	GuestSocketPath = podpath.Socket
	workspaceDir    = "/workspace"
	agentHome       = "/home/agent"
	rootHome        = "/root"
	// diskMount is where the guest-install init container sees the disk volume.
	diskMount = "/.agentbox/disk"
	// ContainerName is the sandbox's (main) container; InstallContainerName the init container
	// that installs the agentbox binary and prepares the disk.
	ContainerName        = "sandbox"
	InstallContainerName = "guest-install"
)

// Bounds and defaults of the pod.
const (
	// AgentUID is the user commands run as unless they name another (the local runtimes' agent).
	AgentUID = podpath.AgentUID
	// defaultDiskMB sizes the disk volume when the spec names none.
	defaultDiskMB = 1024
	// guestBinMiB bounds the volume the agentbox binary is copied to.
	guestBinMiB = 512
	// terminationGrace: the agent gets this long after SIGTERM before SIGKILL.
	terminationGrace = 2
)

// capsAdded are the only capabilities a sandbox's processes get (everything else is dropped):
// the local spec's set minus SETPCAP, which only lets a process shrink its own bounding set.
var capsAdded = []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "SETGID", "SETUID"}

// podInput is everything buildPod needs; it does no I/O.
type podInput struct {
	ID, Namespace, Runtime, Instance, Version string
	// Image is the main container's image (an image reference the cluster resolves).
	Image string
	// GuestImage is the init container's image: it holds the agentbox binary at /agentbox.
	GuestImage string
	// RuntimeClass is the pod's runtimeClassName ("": the cluster's default handler).
	RuntimeClass string
	// NodeName pins the pod to a node ("": the scheduler places it).
	NodeName  string
	CPU       float64
	MemoryMB  int64
	DiskMB    int64
	Env       map[string]string
	PullNever bool
	// Delivery is DeliveryImageVolume or DeliveryInitContainer ("").
	Delivery string
}

// buildPod is the hardened pod of one sandbox.
func buildPod(in podInput) *corev1.Pod {
	diskMB := in.DiskMB
	if diskMB <= 0 {
		diskMB = defaultDiskMB
	}
	res := corev1.ResourceList{}
	if in.CPU > 0 {
		res[corev1.ResourceCPU] = *resource.NewMilliQuantity(max(int64(in.CPU*1000), 1), resource.DecimalSI)
	}
	if in.MemoryMB > 0 {
		res[corev1.ResourceMemory] = *resource.NewQuantity(in.MemoryMB<<20, resource.BinarySI)
	}
	resources := corev1.ResourceRequirements{Requests: res, Limits: maps.Clone(res)}
	pull := corev1.PullIfNotPresent
	if in.PullNever {
		pull = corev1.PullNever
	}
	sc := &corev1.SecurityContext{
		// The agent runs as root inside (it runs each command as the agent user or the one the
		// command names, and owns the job logs); root with only capsAdded, no privilege gain
		// through exec, and a read-only root file system.
		RunAsUser:                ptr(int64(0)),
		RunAsGroup:               ptr(int64(0)),
		RunAsNonRoot:             ptr(false),
		Privileged:               ptr(false),
		AllowPrivilegeEscalation: ptr(false),
		ReadOnlyRootFilesystem:   ptr(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: slices.Clone(capsAdded)},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	installSC := sc.DeepCopy()
	installSC.Capabilities.Add = []corev1.Capability{"CHOWN", "FOWNER", "DAC_OVERRIDE"}
	labels := map[string]string{LabelManagedBy: managedBy, LabelRole: roleSB, LabelSandbox: in.ID, LabelRuntime: in.Runtime}
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name: in.ID, Namespace: in.Namespace, Labels: labels,
			Annotations: map[string]string{AnnotationInstance: in.Instance, AnnotationVersion: in.Version},
		},
		Spec: corev1.PodSpec{
			Hostname:                      in.ID,
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr(false),
			EnableServiceLinks:            ptr(false),
			TerminationGracePeriodSeconds: ptr(int64(terminationGrace)),
			NodeName:                      in.NodeName,
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			InitContainers: []corev1.Container{{
				Name:            InstallContainerName,
				Image:           in.GuestImage,
				ImagePullPolicy: pull,
				Command: []string{"/agentbox", "guest-install", "--binary", GuestBinaryPath, "--disk", diskMount,
					"--uid", strconv.Itoa(AgentUID), "--tmp", "/tmp"},
				Resources:       resources,
				SecurityContext: installSC,
				VolumeMounts: []corev1.VolumeMount{
					{Name: "guest", MountPath: guestBinDir},
					{Name: "disk", MountPath: diskMount},
					{Name: "tmp", MountPath: "/tmp"},
				},
			}},
			Containers: []corev1.Container{{
				Name:            ContainerName,
				Image:           in.Image,
				ImagePullPolicy: pull,
				Command: []string{GuestBinaryPath, "guest", "--socket", GuestSocketPath,
					"--user", fmt.Sprintf("%d:%d", AgentUID, AgentUID), "--workdir", workspaceDir,
					// A pod has no rlimit field: the agent caps RLIMIT_FSIZE itself, at the
					// disk's size, as the local runtimes' OCI spec does.
					"--fsize-mb", strconv.FormatInt(diskMB, 10)},
				WorkingDir:      workspaceDir,
				Env:             buildEnv(in.Env),
				Resources:       resources,
				SecurityContext: sc,
				VolumeMounts: []corev1.VolumeMount{
					{Name: "guest", MountPath: guestBinDir, ReadOnly: true},
					{Name: "disk", MountPath: GuestRunDir, SubPath: "run"},
					{Name: "disk", MountPath: workspaceDir, SubPath: "workspace"},
					{Name: "disk", MountPath: agentHome, SubPath: "home"},
					{Name: "disk", MountPath: rootHome, SubPath: "root"},
					{Name: "tmp", MountPath: "/tmp"},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "guest", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr(resource.MustParse(strconv.Itoa(guestBinMiB) + "Mi"))}}},
				{Name: "disk", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(diskMB<<20, resource.BinarySI)}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory,
					SizeLimit: resource.NewQuantity(tmpfs.TmpMiB(in.MemoryMB)<<20, resource.BinarySI)}}},
			},
		},
	}
	if in.RuntimeClass != "" {
		pod.Spec.RuntimeClassName = ptr(in.RuntimeClass)
	}
	if in.Delivery == DeliveryImageVolume {
		// The guest image is mounted read-only as an image volume: no init container, no copy,
		// and no wait for the kubelet to notice an init container's exit (its PLEG relists
		// every second). The agent's entrypoint prepares the disk's directories itself, as
		// root, then execs the agent (guest-kube).
		pod.Spec.InitContainers = nil
		pod.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: in.GuestImage, PullPolicy: pull}}
		main := &pod.Spec.Containers[0]
		main.Command = append([]string{GuestBinaryPath, "guest-kube", "--uid", strconv.Itoa(AgentUID), "--"}, main.Command[1:]...)
	}
	return pod
}

// Ways of delivering the agent into a pod (Config.Delivery).
const (
	// DeliveryImageVolume mounts the guest image as an image volume (Kubernetes' ImageVolume,
	// on by default since 1.35; containerd 2.1 or later).
	DeliveryImageVolume = "image-volume"
	// DeliveryInitContainer copies the binary from the guest image into an emptyDir in an
	// init container (any cluster).
	DeliveryInitContainer = "init-container"
)

// buildEnv is the main container's environment: HOME and TERM as on the local runtimes (the
// image's own variables, PATH among them, stay the image's), then the spec's, sorted by name.
func buildEnv(spec map[string]string) []corev1.EnvVar {
	env := map[string]string{"HOME": agentHome, "TERM": "xterm"}
	maps.Copy(env, spec)
	out := make([]corev1.EnvVar, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		// The kubelet expands $(NAME) in values and turns $$ into $: doubling every $ keeps
		// each value as it was written.
		out = append(out, corev1.EnvVar{Name: k, Value: strings.ReplaceAll(env[k], "$", "$$")})
	}
	return out
}

func ptr[T any](v T) *T { return &v }
