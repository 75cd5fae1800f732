package microvm

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// qmpRun runs one QMP command on the VM's monitor socket and returns its "return" value.
func (r *Runtime) qmpRun(ctx context.Context, id string, cmd map[string]any) (json.RawMessage, error) {
	timeout := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	mon, err := qmp.NewSocketMonitor("unix", filepath.Join(r.dir(id), "run", "qmp.sock"), timeout)
	if err != nil {
		return nil, err
	}
	if err := mon.Connect(); err != nil {
		return nil, err
	}
	defer mon.Disconnect()
	b, _ := json.Marshal(cmd)
	out, err := mon.Run(b)
	if err != nil {
		return nil, err
	}
	var reply struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(out, &reply); err != nil {
		return nil, err
	}
	return reply.Return, nil
}

// checkQMP asks the VM's monitor its name and status: it must be this sandbox's, running.
func (r *Runtime) checkQMP(ctx context.Context, id string) error {
	out, err := r.qmpRun(ctx, id, map[string]any{"execute": "query-name"})
	if err != nil {
		return err
	}
	var name struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(out, &name); err != nil || name.Name != id {
		return fmt.Errorf("the VM's name is %q, not %s", name.Name, id)
	}
	out, err = r.qmpRun(ctx, id, map[string]any{"execute": "query-status"})
	if err != nil {
		return err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return err
	}
	if st.Status != "running" {
		return fmt.Errorf("the VM is %s", st.Status)
	}
	return nil
}
