package kubernetes

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	wantCPU, wantMem := max(int64(cpu*1000), 1), max(memoryMB<<20, 1)
	var out Room
	for i := range nodes {
		n := &nodes[i]
		if n.Spec.Unschedulable || !nodeReady(n) {
			continue
		}
		out.Nodes++
		freeCPU := n.Status.Allocatable.Cpu().MilliValue() - usedCPU[n.Name]
		freeMem := n.Status.Allocatable.Memory().Value() - usedMem[n.Name]
		out.FreeMilliCPU = max(out.FreeMilliCPU, freeCPU)
		out.FreeMemoryMB = max(out.FreeMemoryMB, freeMem>>20)
		if freeCPU > 0 && freeMem > 0 {
			out.Fit += min(freeCPU/wantCPU, freeMem/wantMem)
		}
	}
	return out
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
