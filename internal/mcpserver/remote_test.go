package mcpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/remoteexec"
	"github.com/agentbox/agentbox/internal/remoteops"
	"github.com/agentbox/agentbox/internal/screenshot"
	"github.com/agentbox/agentbox/internal/store"
)

// fakeMachines resolves "box" (and its alias "b1") to a machine agent's handlers served on
// loopback, as machine.Registry resolves a joined machine; anything else is MACHINE_NOT_FOUND.
type fakeMachines struct{ hc *http.Client }

func (f fakeMachines) Client(_ context.Context, ref string) (*http.Client, store.Machine, error) {
	if ref != "box" && ref != "b1" {
		return nil, store.Machine{}, errcode.New(errcode.MachineNotFound, "no machine %q", ref)
	}
	return f.hc, store.Machine{Platform: "linux"}, nil
}

// machineAgent serves the machine-side handlers the agent mounts (/exec, /screenshot).
func machineAgent(t *testing.T) fakeMachines {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/exec", remoteexec.NewHandler(remoteexec.Options{}))
	mux.Handle("/screenshot", screenshot.NewHandler(screenshot.Options{}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
	}
	return fakeMachines{hc: &http.Client{Transport: tr}}
}

func remoteServices(t *testing.T) mcpserver.RemoteServices {
	m := machineAgent(t)
	return mcpserver.RemoteServices{Exec: remoteops.NewExec(m), Screenshots: remoteops.NewScreenshots(m)}
}

// TestRemoteExecTool: remote_exec through MCP: sh and bash, the bounds refused, env with
// elevated refused, a timeout partial, an unknown machine; without machines,
// UNSUPPORTED_OPERATION.
func TestRemoteExecTool(t *testing.T) {
	srv := mcpserver.New(nil, mcpserver.Options{Remote: remoteServices(t)})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[0])
	var out mcpserver.RemoteExecOut
	txt := c.ok("remote_exec", map[string]any{"machine": "box", "command": "echo hi; echo oops >&2; exit 4"}, &out)
	if out.Stdout != "hi\n" || out.Stderr != "oops\n" || out.ExitCode == nil || *out.ExitCode != 4 || out.Partial || out.Shell != "sh" {
		t.Errorf("sh: %+v", out)
	}
	if !strings.Contains(txt, "exit_code 4") || !strings.Contains(txt, "hi") {
		t.Errorf("text %q", txt)
	}
	c.ok("remote_exec", map[string]any{"machine": "b1", "shell": "bash", "command": `a=(x y); echo ${#a[@]} $V`, "env": map[string]string{"V": "v"}}, &out)
	if out.Stdout != "2 v\n" || out.Shell != "bash" {
		t.Errorf("bash: %+v", out)
	}
	for _, args := range []map[string]any{
		{"machine": "box", "command": "true", "timeout_ms": 0},
		{"machine": "box", "command": "true", "timeout_ms": 999},
		{"machine": "box", "command": "true", "timeout_ms": 3600001},
		{"machine": "box", "command": "true", "elevated": true, "env": map[string]string{"A": "1"}},
		{"machine": "box", "command": "dir", "shell": "cmd"},
		{"machine": "box", "command": "true", "cwd": "relative"},
	} {
		msg := c.fails("remote_exec", args, "INVALID_ARGUMENT")
		if msg == "" {
			t.Errorf("%v: no message", args)
		}
	}
	c.ok("remote_exec", map[string]any{"machine": "box", "command": "echo started; sleep 30", "timeout_ms": 1000}, &out)
	if !out.Partial || out.Reason != "timeout" || out.ExitCode != nil || out.Stdout != "started\n" {
		t.Errorf("timeout: %+v", out)
	}
	c.fails("remote_exec", map[string]any{"machine": "nope", "command": "true"}, "MACHINE_NOT_FOUND")
	bare := mcpserver.New(nil, mcpserver.Options{})
	defer bare.Close()
	connect(t, bare, protocolVersions[0]).fails("remote_exec", map[string]any{"machine": "box", "command": "true"}, "UNSUPPORTED_OPERATION")
}

// startXvfb starts a real X server with a solid root of colour and returns its display number.
func startXvfb(t *testing.T, colour string) int {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("Xvfb", "-displayfd", "3", "-screen", "0", "200x100x24", "-nolisten", "tcp", "-noreset")
	cmd.ExtraFiles = []*os.File{pw}
	if err := cmd.Start(); err != nil {
		t.Fatalf("Xvfb (make deps installs xvfb): %v", err)
	}
	pw.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	_ = pr.SetReadDeadline(time.Now().Add(20 * time.Second))
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("Xvfb did not start: %v", err)
	}
	var n int
	fmt.Sscan(line, &n)
	set := exec.Command("xsetroot", "-solid", colour)
	set.Env = append(os.Environ(), fmt.Sprintf("DISPLAY=:%d", n))
	if out, err := set.CombinedOutput(); err != nil {
		t.Fatalf("xsetroot: %v %s", err, out)
	}
	return n
}

// TestRemoteScreenshotTool: the image comes back as image content after the caption, and its
// pixels are the display's; REST serves the same.
func TestRemoteScreenshotTool(t *testing.T) {
	n := startXvfb(t, "#00ff00")
	rs := remoteServices(t)
	srv := mcpserver.New(nil, mcpserver.Options{Remote: rs})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[0])
	res := c.call("remote_screenshot", map[string]any{"machine": "box", "display": n})
	if res.IsError || len(res.Content) != 2 {
		t.Fatalf("screenshot: %v %d contents", text(res), len(res.Content))
	}
	img, ok := res.Content[1].(*mcp.ImageContent)
	if !ok || img.MIMEType != "image/png" {
		t.Fatalf("content[1] is %T", res.Content[1])
	}
	pic, err := png.Decode(bytes.NewReader(img.Data))
	if err != nil {
		t.Fatal(err)
	}
	if r, g, b, _ := pic.At(150, 50).RGBA(); r != 0 || g != 0xffff || b != 0 || pic.Bounds().Dx() != 200 {
		t.Errorf("pixel %d,%d,%d of %v", r, g, b, pic.Bounds())
	}
	if want := fmt.Sprintf("X11 display :%d, screen 0 of 1, 200×100", n); !strings.Contains(text(res), want) {
		t.Errorf("caption %q lacks %q", text(res), want)
	}
	c.fails("remote_screenshot", map[string]any{"machine": "box", "display": 1000}, "INVALID_ARGUMENT")

	// REST: the same through api.Server.
	h := httptest.NewServer(api.New(nil, api.Options{Token: "tok", RemoteExec: rs.Exec, Screenshots: rs.Screenshots}))
	defer h.Close()
	get := func(method, path, body string) (int, map[string]any) {
		req, _ := http.NewRequest(method, h.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	code, out := get("GET", fmt.Sprintf("/v1/machines/box/screenshot?display=%d", n), "")
	if code != 200 || out["width"] != float64(200) || !strings.Contains(fmt.Sprint(out["caption"]), "200×100") || out["png"] == "" {
		t.Errorf("REST screenshot: %d %v %v", code, out["width"], out["caption"])
	}
	if code, _ := get("GET", "/v1/machines/box/screenshot?display=-1", ""); code != 400 {
		t.Errorf("display=-1: %d", code)
	}
	code, out = get("POST", "/v1/machines/box/exec", `{"command":"echo rest","shell":"bash"}`)
	if code != 200 || out["stdout"] != "rest\n" || out["exit_code"] != float64(0) || out["partial"] != false {
		t.Errorf("REST exec: %d %v", code, out)
	}
	for _, body := range []string{`{"command":"true","timeout_ms":0}`, `{"command":"true","elevated":true,"env":{"A":"1"}}`, `{"command":"true","bogus":1}`} {
		if code, out := get("POST", "/v1/machines/box/exec", body); code != 400 {
			t.Errorf("%s: %d %v", body, code, out)
		}
	}
	if code, _ := get("POST", "/v1/machines/nope/exec", `{"command":"true"}`); code != 404 {
		t.Errorf("unknown machine: %d", code)
	}
}
