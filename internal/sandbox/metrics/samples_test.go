package metrics

import (
	"fmt"
	"testing"
	"time"
)

// TestCPUSamplesBounded: the previous samples never exceed the bound; the least recently
// sampled sandbox goes first.
func TestCPUSamplesBounded(t *testing.T) {
	c := cpuSamples{bound: 3}
	t0 := time.Now()
	for i := 0; i < 10; i++ {
		c.swap(fmt.Sprintf("sb-%012d", i), cpuSample{usage: float64(i), at: t0.Add(time.Duration(i) * time.Second)})
		if c.len() > 3 {
			t.Fatalf("%d samples kept, bound 3", c.len())
		}
	}
	if _, ok := c.swap("sb-000000000009", cpuSample{at: t0.Add(time.Minute)}); !ok {
		t.Error("the most recent sample was evicted")
	}
	if _, ok := c.swap("sb-000000000000", cpuSample{at: t0.Add(time.Minute)}); ok {
		t.Error("the oldest sample was kept")
	}
	c.drop("sb-000000000009")
	if c.len() != 2 {
		t.Errorf("%d after drop", c.len())
	}
}
