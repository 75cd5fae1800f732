package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Room is what the cluster can still place, as the scheduler counts it: per node that takes
// pods (schedulable and Ready), its allocatable cpu and memory less the requests of the pods
// bound to it that have not finished.
type Room struct {
	// Nodes is how many nodes take pods.
	Nodes int
	// FreeMilliCPU and FreeMemoryMB are the roomiest node's free cpu (millicores) and memory.
	FreeMilliCPU int64
	FreeMemoryMB int64
	// Fit is how many more sandboxes of the asked shape the nodes hold, all told.
	Fit int64
}

// Room reports what the cluster can still place, and how many sandboxes of cpu cores and
// memoryMB fit (agentbox doctor). It lists nodes and every namespace's pods: it needs list on
// both, which a sandbox-only role may not have.
func (r *Runtime) Room(ctx context.Context, cpu float64, memoryMB int64) (Room, error) {
	if r.api == nil {
		return Room{}, errors.New(r.caps.Reason)
	}
	nodes, err := r.api.nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return Room{}, fmt.Errorf("list nodes: %w", err)
	}
	pods, err := r.api.pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.phase!=Succeeded,status.phase!=Failed"})
	if err != nil {
		return Room{}, fmt.Errorf("list pods: %w", err)
	}
	return room(nodes.Items, pods.Items, cpu, memoryMB), nil
}

// room is Room over listed nodes and pods.
func room(nodes []corev1.Node, pods []corev1.Pod, cpu float64, memoryMB int64) Room {
	wantCPU, wantMem := max(int64(cpu*1000), 1), max(memoryMB<<20, 1)
	var out Room
	for _, n := range nodesRoom(nodes, pods) {
		out.Nodes++
		out.FreeMilliCPU = max(out.FreeMilliCPU, n.freeCPU)
		out.FreeMemoryMB = max(out.FreeMemoryMB, n.freeMem>>20)
		if n.freeCPU > 0 && n.freeMem > 0 {
			out.Fit += min(n.freeCPU/wantCPU, n.freeMem/wantMem)
		}
	}
	return out
}

// nodeRoom is one node's free cpu (millicores) and memory (bytes).
type nodeRoom struct{ freeCPU, freeMem int64 }

// nodesRoom is the free room of each node that takes pods (schedulable and Ready): its
// allocatable less the requests of the pods bound to it.
func nodesRoom(nodes []corev1.Node, pods []corev1.Pod) []nodeRoom {
	usedCPU, usedMem := map[string]int64{}, map[string]int64{}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" {
			continue
		}
		c, m := podRequests(p)
		usedCPU[p.Spec.NodeName] += c
		usedMem[p.Spec.NodeName] += m
	}
	var out []nodeRoom
	for i := range nodes {
		n := &nodes[i]
		if n.Spec.Unschedulable || !nodeReady(n) {
			continue
		}
		out = append(out, nodeRoom{n.Status.Allocatable.Cpu().MilliValue() - usedCPU[n.Name], n.Status.Allocatable.Memory().Value() - usedMem[n.Name]})
	}
	return out
}

// placeEvery is how long neverPlaceable's answer for a pod holds (it lists every node and pod).
const placeEvery = 5 * time.Second

type placeAnswer struct {
	at    time.Time
	never bool
}

// neverPlaceable reports whether pending pod p fits on no Ready, schedulable node even with
// every agentbox sandbox pod gone: its requests exceed each node's allocatable less what the
// other (non-sandbox) pods there request. A pod that would fit then waits for room instead
// (sandboxes end); one that would not fails at once. An error (the cluster would not list
// nodes or pods to this user) leaves the pod waiting.
func (r *Runtime) neverPlaceable(ctx context.Context, p *corev1.Pod) (bool, error) {
	r.mu.Lock()
	if a, ok := r.placed[p.UID]; ok && time.Since(a.at) < placeEvery {
		r.mu.Unlock()
		return a.never, nil
	}
	r.mu.Unlock()
	nodes, err := r.api.nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err
	}
	pods, err := r.api.pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.phase!=Succeeded,status.phase!=Failed"})
	if err != nil {
		return false, err
	}
	others := pods.Items[:0]
	for _, q := range pods.Items {
		if q.Labels[LabelManagedBy] != managedBy || q.Labels[LabelRole] != roleSB {
			others = append(others, q)
		}
	}
	cpu, mem := podRequests(p)
	never := true
	for _, n := range nodesRoom(nodes.Items, others) {
		if n.freeCPU >= cpu && n.freeMem >= mem {
			never = false
			break
		}
	}
	r.mu.Lock()
	if r.placed == nil || len(r.placed) > 1024 {
		r.placed = map[types.UID]placeAnswer{}
	}
	r.placed[p.UID] = placeAnswer{at: time.Now(), never: never}
	r.mu.Unlock()
	return never, nil
}

// podRequests is a pod's cpu (millicores) and memory (bytes) requests as the scheduler counts
// them: its containers' sum or its largest init container's, whichever is more, plus overhead.
func podRequests(p *corev1.Pod) (cpu, mem int64) {
	for _, c := range p.Spec.Containers {
		cpu += c.Resources.Requests.Cpu().MilliValue()
		mem += c.Resources.Requests.Memory().Value()
	}
	for _, c := range p.Spec.InitContainers {
		cpu = max(cpu, c.Resources.Requests.Cpu().MilliValue())
		mem = max(mem, c.Resources.Requests.Memory().Value())
	}
	cpu += p.Spec.Overhead.Cpu().MilliValue()
	mem += p.Spec.Overhead.Memory().Value()
	return cpu, mem
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
