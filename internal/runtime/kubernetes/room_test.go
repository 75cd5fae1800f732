package kubernetes

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRoom: what the cluster can still place is each Ready, schedulable node's allocatable
// less the requests of the unfinished pods bound to it (containers summed, init containers at
// their largest, overhead added); a sandbox shape fits as many times as both cpu and memory
// allow on each node.
func TestRoom(t *testing.T) {
	node := func(name string, cpu, mem string, ready, cordoned bool) corev1.Node {
		st := corev1.ConditionTrue
		if !ready {
			st = corev1.ConditionFalse
		}
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Unschedulable: cordoned},
			Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)},
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}}}
	}
	req := func(cpu, mem string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}}
	}
	pod := func(nodeName string, init corev1.ResourceRequirements, cs ...corev1.ResourceRequirements) corev1.Pod {
		p := corev1.Pod{Spec: corev1.PodSpec{NodeName: nodeName, InitContainers: []corev1.Container{{Resources: init}}}}
		for _, c := range cs {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Resources: c})
		}
		return p
	}
	nodes := []corev1.Node{
		node("a", "2", "4Gi", true, false),
		node("b", "4", "8Gi", true, true),    // cordoned
		node("c", "8", "16Gi", false, false), // not Ready
	}
	pods := []corev1.Pod{
		pod("a", req("100m", "64Mi"), req("500m", "512Mi"), req("250m", "256Mi")), // 750m, 768Mi
		pod("a", req("1", "1Gi"), req("100m", "128Mi")),                           // init dominates: 1000m, 1Gi
		pod("", req("0", "0"), req("64", "1Ti")),                                  // pending, bound nowhere
	}
	got := room(nodes, pods, 0.25, 256)
	want := Room{Nodes: 1, FreeMilliCPU: 250, FreeMemoryMB: 4096 - 768 - 1024, Fit: 1}
	if got != want {
		t.Fatalf("room = %+v, want %+v", got, want)
	}
	if got := room(nodes, pods, 1, 512); got.Fit != 0 {
		t.Errorf("a 1-core sandbox fits %d times in 250m", got.Fit)
	}
}
