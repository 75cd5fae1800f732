package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/createtrace"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes/kubetest"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/wire"
)

// The kubernetes runtime: create → first exec result over REST on the kubernetes
// runtime with the runc class and with the gVisor class, next to local runc in the same run,
// and next to what `kubectl run` + `kubectl exec` of an equivalent pod costs (client-go: create a
// pod of the same image, cpu and memory, wait for Running, exec `true` through pods/exec). On the
// cluster AGENTBOX_TEST_KUBECONFIG names (kubetest), in a namespace of its own, deleted after.

type kubeBench struct {
	only     *bool
	n        *int
	replicaN *int // creates per round of the replicas figures (kubereplicas.go)
	replicaC *int // of them in flight at once
}

func kubeBenchFlags() kubeBench {
	return kubeBench{
		only:     flag.Bool("kube-only", false, "measure only the kubernetes runtime's figures (needs AGENTBOX_TEST_KUBECONFIG; writes -out only if it is not the default bench/results.json)"),
		n:        flag.Int("kube-creates", 20, "timed creates per runtime (and plain pods) in the kubernetes figures"),
		replicaN: flag.Int("kube-replica-creates", 100, "creates per round in the two-replica figures (one replica, then two; 0: no replicas figures)"),
		replicaC: flag.Int("kube-replica-inflight", 8, "creates in flight at once in the two-replica figures"),
	}
}

// Names of the kubernetes figures.
const (
	measureKubeCreate = "create → first exec result (REST)"
	measureKubePlain  = "plain pod: create → Running → exec `true` (kubectl run + exec)"
	measureKubeVols   = "plain pod with the sandbox pod's volumes: create → Running → exec `true`"
)

func runKubeBench(ctx context.Context, bin string, kb kubeBench, out string) {
	kc := os.Getenv(kubetest.EnvKubeconfig)
	if kc == "" {
		log.Fatal("-kube-only needs AGENTBOX_TEST_KUBECONFIG (make k8s-up prints one)")
	}
	lab, err := kubetest.Open(kc, bin)
	if err != nil {
		log.Fatal(err)
	}
	defer lab.Close()
	ns, delNS, err := lab.Namespace(ctx, "ab-kuberuntime-bench")
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := delNS(); err != nil {
			log.Printf("delete namespace %s: %v", ns, err)
		}
	}()
	dir, err := os.MkdirTemp("", "abbench-kube")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o711); err != nil {
		log.Fatal(err)
	}
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	parents := map[string]string{"runc": "agentbox-bench-kube-runc"}
	defer removeCgroupParents(parents)
	runc, err := oci.New(ctx, oci.Config{Name: "runc", Flavor: oci.FlavorRunc, Root: filepath.Join(dir, "runc"), GuestBinary: bin,
		CgroupParent: parents["runc"], Subreaper: true})
	if err != nil {
		log.Fatal(err)
	}
	kubeRunc, err := lab.Runtime(ctx, ns, runtime.IsolationProcess, "runc")
	if err != nil {
		log.Fatal(err)
	}
	kubeGVisor, err := lab.Runtime(ctx, ns, runtime.IsolationKernel, "gvisor")
	if err != nil {
		log.Fatal(err)
	}
	rts := []runtime.Runtime{runc, kubeRunc, kubeGVisor}
	res := Results{CPUs: goruntime.NumCPU(), When: time.Now().UTC()}
	res.Host, _ = os.Hostname()
	for _, rt := range rts {
		res.Runtimes = append(res.Runtimes, rt.Capabilities())
	}
	res.Runtime = res.Runtimes[0].Version
	traces := createtrace.New(0) // the create trace's per-step table (create.go)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(traces))
	defer tp.Shutdown(context.Background())
	svc, err := sandbox.NewService(st, rts, sandbox.Config{MaxSandboxes: 50, Tracing: tp}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer svc.Close()
	const token = "bench-token-0123456789abcdef"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go http.Serve(ln, api.New(svc, api.Options{Token: token}))
	c := client.New("http://"+ln.Addr().String(), token)
	shape := wire.CreateRequest{CPU: 0.5, MemoryMB: 256, DiskMB: 256}
	measured := map[string]float64{}
	n := *kb.n
	createExec := map[string][]float64{}
	var plain, plainVols []float64
	// In turns, so that the machine's load falls on every figure alike.
	for i := 0; i < n; i++ {
		for _, rt := range rts {
			req := shape
			req.Runtime = rt.Name()
			id, d, _ := mustColdCreate(ctx, c, req) // as every create figure is measured
			createExec[rt.Name()] = append(createExec[rt.Name()], d)
			measured[id] = d
		}
		d, err := plainPod(ctx, lab, ns, fmt.Sprintf("plain-%d", i), shape, false)
		if err != nil {
			log.Fatalf("plain pod: %v", err)
		}
		plain = append(plain, ms(d))
		if d, err = plainPod(ctx, lab, ns, fmt.Sprintf("plain-vols-%d", i), shape, true); err != nil {
			log.Fatalf("plain pod with volumes: %v", err)
		}
		plainVols = append(plainVols, ms(d))
	}
	for _, rt := range rts {
		s := summarize(measureKubeCreate, "ms", createExec[rt.Name()])
		s.Runtime = rt.Name()
		s.Floor = "local runc in the same run, in turns"
		res.Stats = append(res.Stats, s)
	}
	s := summarize(measureKubePlain, "ms", plain)
	s.Runtime = "kubernetes (client-go)"
	s.Floor = "same image, cpu and memory, runc class, in turns"
	res.Stats = append(res.Stats, s)
	s = summarize(measureKubeVols, "ms", plainVols)
	s.Runtime = "kubernetes (client-go)"
	s.Floor = "as the plain pod, with the guest image volume and the disk and /tmp emptyDirs"
	res.Stats = append(res.Stats, s)
	var names []string
	for _, rt := range rts {
		names = append(names, rt.Name())
	}
	res.CreateTrace = traceTables(traces, measured, names)
	if *kb.replicaN > 0 {
		res.Stats = append(res.Stats, runKubeReplicasBench(ctx, lab, ns, *kb.replicaN, *kb.replicaC)...)
	}
	printStats(res.Stats)
	printTraceTables(res.CreateTrace)
	if out != "bench/results.json" {
		writeResults(res, out)
	}
}

// plainPod is `kubectl run` + `kubectl exec` of a pod like a sandbox's (the busybox host image,
// the same cpu and memory, the runc class), through client-go: create, watch until Running (as
// `kubectl run --wait` does), exec `true`; then it deletes the pod (not timed). With vols, the pod
// mounts the volumes a sandbox pod has (the guest image as an image volume, a disk emptyDir and
// a memory /tmp): the kubelet's own cost of volumes, which every sandbox pod pays.
func plainPod(ctx context.Context, lab *kubetest.Lab, ns, name string, shape wire.CreateRequest, vols bool) (time.Duration, error) {
	res := corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(int64(shape.CPU*1000), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(shape.MemoryMB<<20, resource.BinarySI)}
	class := "runc"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{RuntimeClassName: &class, RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: new(bool),
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "main", Image: lab.HostImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sleep", "3600"}, Resources: corev1.ResourceRequirements{Requests: res, Limits: res}}}}}
	if vols {
		pod.Spec.Volumes = []corev1.Volume{
			{Name: "guest", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: lab.GuestImage, PullPolicy: corev1.PullNever}}},
			{Name: "disk", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(shape.DiskMB<<20, resource.BinarySI)}}},
			{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
		}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "guest", MountPath: "/.agentbox/bin", ReadOnly: true},
			{Name: "disk", MountPath: "/workspace"}, {Name: "tmp", MountPath: "/tmp"}}
	}
	pods := lab.Client.CoreV1().Pods(ns)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	w, err := pods.Watch(wctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return 0, err
	}
	defer w.Stop()
	t0 := time.Now()
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	defer pods.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	for running := false; !running; {
		ev, ok := <-w.ResultChan()
		if !ok {
			return 0, fmt.Errorf("pod %s: the watch ended before it ran", name)
		}
		if p, isPod := ev.Object.(*corev1.Pod); isPod {
			running = p.Status.Phase == corev1.PodRunning
		}
	}
	req := lab.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "main", Command: []string{"true"}, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewWebSocketExecutor(lab.REST, "GET", req.URL().String())
	if err != nil {
		return 0, err
	}
	var stdout, stderr bytes.Buffer
	if err := ex.StreamWithContext(wctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		return 0, fmt.Errorf("exec: %v (%s)", err, stderr.String())
	}
	return time.Since(t0), nil
}
