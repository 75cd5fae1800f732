// Package gpu reports a machine's NVIDIA GPUs: it runs nvidia-smi's CSV query and parses its
// output strictly and within bounds. A machine without nvidia-smi has no GPUs.
package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Bounds on what a machine may report (the server checks heartbeats against them too).
const (
	MaxGPUs     = 64  // GPUs on one machine
	MaxNameLen  = 128 // bytes of a GPU's model name
	maxOutput   = 64 << 10
	queryFields = "index,name,memory.total,memory.used,utilization.gpu"
)

// GPU is one NVIDIA GPU as nvidia-smi reports it. MemoryUsedMB and UtilizationPct are -1 when
// nvidia-smi says "[N/A]" for them.
type GPU struct {
	Index          int    `json:"index"`
	Name           string `json:"name"`
	MemoryTotalMB  int64  `json:"memory_total_mb"`
	MemoryUsedMB   int64  `json:"memory_used_mb"`
	UtilizationPct int    `json:"utilization_pct"`
}

// Args are nvidia-smi's arguments for the query Parse reads.
var Args = []string{"--query-gpu=" + queryFields, "--format=csv,noheader,nounits"}

// Query runs nvidia-smi (found on PATH) and parses its output. No nvidia-smi on PATH: no GPUs
// and no error. nvidia-smi failing (no driver loaded, say) is an error naming its stderr.
func Query(ctx context.Context) ([]GPU, error) {
	path, err := exec.LookPath("nvidia-smi")
	if err != nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, Args...)
	var out, errb limitedBuffer
	out.max, errb.max = maxOutput, 4<<10
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("nvidia-smi: %w: %s", err, strings.TrimSpace(errb.String()))
	}
	if out.over {
		return nil, fmt.Errorf("nvidia-smi: output exceeds %d bytes", maxOutput)
	}
	return Parse(out.Bytes())
}

// Parse reads nvidia-smi's `--query-gpu=index,name,memory.total,memory.used,utilization.gpu
// --format=csv,noheader,nounits` output: one line per GPU, five comma-separated fields. Any
// line that is not exactly that, a repeated index or more than MaxGPUs GPUs is an error.
func Parse(out []byte) ([]GPU, error) {
	if len(out) > maxOutput {
		return nil, fmt.Errorf("nvidia-smi output exceeds %d bytes", maxOutput)
	}
	if !utf8.Valid(out) {
		return nil, errors.New("nvidia-smi output is not UTF-8")
	}
	var gpus []GPU
	seen := map[int]bool{}
	for n, line := range strings.Split(strings.ReplaceAll(string(out), "\r\n", "\n"), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 5 {
			return nil, fmt.Errorf("nvidia-smi line %d: want 5 comma-separated fields, got %d: %q", n+1, len(f), line)
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		var g GPU
		var err error
		if g.Index, err = strconv.Atoi(f[0]); err != nil || g.Index < 0 || g.Index >= 1024 {
			return nil, fmt.Errorf("nvidia-smi line %d: index %q is not an integer 0–1023", n+1, f[0])
		}
		if seen[g.Index] {
			return nil, fmt.Errorf("nvidia-smi line %d: index %d repeated", n+1, g.Index)
		}
		seen[g.Index] = true
		g.Name = f[1]
		if g.Name == "" || len(g.Name) > MaxNameLen {
			return nil, fmt.Errorf("nvidia-smi line %d: name must be 1–%d bytes", n+1, MaxNameLen)
		}
		if g.MemoryTotalMB, err = number(f[2], 1<<30); err != nil || g.MemoryTotalMB < 0 {
			return nil, fmt.Errorf("nvidia-smi line %d: memory.total %q is not a number of MiB", n+1, f[2])
		}
		if g.MemoryUsedMB, err = number(f[3], 1<<30); err != nil {
			return nil, fmt.Errorf("nvidia-smi line %d: memory.used %q is not a number of MiB", n+1, f[3])
		}
		u, err := number(f[4], 100)
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi line %d: utilization.gpu %q is not a percentage", n+1, f[4])
		}
		g.UtilizationPct = int(u)
		gpus = append(gpus, g)
		if len(gpus) > MaxGPUs {
			return nil, fmt.Errorf("nvidia-smi reports more than %d GPUs", MaxGPUs)
		}
	}
	return gpus, nil
}

// number parses a non-negative integer at most max, or "[N/A]" / "[Not Supported]" as -1.
func number(s string, max int64) (int64, error) {
	if s == "[N/A]" || s == "[Not Supported]" {
		return -1, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || v > max {
		return 0, fmt.Errorf("not an integer 0–%d", max)
	}
	return v, nil
}

// Check reports whether gpus is within the bounds Parse enforces (a server checks what a
// machine reports with it).
func Check(gpus []GPU) error {
	if len(gpus) > MaxGPUs {
		return fmt.Errorf("%d GPUs: at most %d", len(gpus), MaxGPUs)
	}
	seen := map[int]bool{}
	for _, g := range gpus {
		switch {
		case g.Index < 0 || g.Index >= 1024 || seen[g.Index]:
			return fmt.Errorf("GPU index %d: repeated or outside 0–1023", g.Index)
		case g.Name == "" || len(g.Name) > MaxNameLen || !utf8.ValidString(g.Name):
			return fmt.Errorf("GPU %d: name must be 1–%d bytes of UTF-8", g.Index, MaxNameLen)
		case g.MemoryTotalMB < -1 || g.MemoryTotalMB > 1<<30 || g.MemoryUsedMB < -1 || g.MemoryUsedMB > 1<<30:
			return fmt.Errorf("GPU %d: memory outside 0–%d MiB", g.Index, 1<<30)
		case g.UtilizationPct < -1 || g.UtilizationPct > 100:
			return fmt.Errorf("GPU %d: utilization %d outside 0–100", g.Index, g.UtilizationPct)
		}
		seen[g.Index] = true
	}
	return nil
}

// limitedBuffer keeps the first max bytes written to it and notes whether there were more.
type limitedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); len(p) > room {
		b.over = true
		if room > 0 {
			b.Buffer.Write(p[:room])
		}
		return len(p), nil
	}
	return b.Buffer.Write(p)
}
