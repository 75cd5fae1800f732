package screenshot_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/screenshot"
)

// xvfb starts a real X server (Xvfb, which picks a free display and tells it through
// -displayfd) of w×h at depth 24 and returns its display number. extra are more Xvfb args.
// -noreset: without it the server resets the root window when its last client (xsetroot)
// disconnects.
func xvfb(t *testing.T, w, h int, extra ...string) int {
	t.Helper()
	if _, err := exec.LookPath("Xvfb"); err != nil {
		t.Fatalf("Xvfb is not installed (make deps installs xvfb): %v", err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-displayfd", "3", "-screen", "0", fmt.Sprintf("%dx%dx24", w, h), "-nolisten", "tcp", "-noreset"}, extra...)
	cmd := exec.Command("Xvfb", args...)
	cmd.ExtraFiles = []*os.File{pw}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	got := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(pr).ReadString('\n')
		got <- strings.TrimSpace(line)
	}()
	select {
	case s := <-got:
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("Xvfb -displayfd said %q", s)
		}
		return n
	case <-time.After(20 * time.Second):
		t.Fatal("Xvfb did not start")
	}
	return 0
}

func machine(t *testing.T) (*screenshot.Client, *httptest.Server) {
	t.Helper()
	srv := httptest.NewServer(screenshot.NewHandler(screenshot.Options{}))
	t.Cleanup(srv.Close)
	tr := srv.Client().Transport.(*http.Transport).Clone()
	addr := srv.Listener.Addr().String()
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	return screenshot.NewClient(&http.Client{Transport: tr}), srv
}

func setRoot(t *testing.T, display int, colour string, env ...string) {
	t.Helper()
	cmd := exec.Command("xsetroot", "-solid", colour)
	cmd.Env = append(os.Environ(), append(env, fmt.Sprintf("DISPLAY=:%d", display))...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("xsetroot: %v: %s", err, out)
	}
}

// assertSolid decodes the PNG and checks every pixel is want.
func assertSolid(t *testing.T, shot *screenshot.Shot, w, h int, want [3]uint8) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(shot.PNG))
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b != image.Rect(0, 0, w, h) || shot.Width != w || shot.Height != h {
		t.Fatalf("image %v, shot %d×%d, want %d×%d", b, shot.Width, shot.Height, w, h)
	}
	bad := 0
	for y := range h {
		for x := range w {
			r, g, b, a := img.At(x, y).RGBA()
			if [3]uint8{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8)} != want || a != 0xffff {
				if bad++; bad < 3 {
					t.Errorf("pixel (%d,%d) = %d,%d,%d,%d, want %v", x, y, r>>8, g>>8, b>>8, a>>8, want)
				}
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d pixels wrong", bad, w*h)
	}
}

func TestScreenshotXvfb(t *testing.T) {
	n := xvfb(t, 320, 200)
	c, _ := machine(t)
	for _, colour := range []struct {
		name string
		rgb  [3]uint8
	}{{"#ff0000", [3]uint8{255, 0, 0}}, {"#00ff80", [3]uint8{0, 255, 128}}, {"#123456", [3]uint8{0x12, 0x34, 0x56}}} {
		setRoot(t, n, colour.name)
		before := time.Now().Add(-time.Second)
		shot, err := c.Capture(context.Background(), &n)
		if err != nil {
			t.Fatal(err)
		}
		assertSolid(t, shot, 320, 200, colour.rgb)
		caption := shot.Caption()
		for _, want := range []string{fmt.Sprintf("X11 display :%d", n), "screen 0 of 1", "320×200", fmt.Sprintf(":%d", n)} {
			if !strings.Contains(caption, want) {
				t.Errorf("caption %q lacks %q", caption, want)
			}
		}
		if shot.TakenAt.Before(before) || shot.TakenAt.After(time.Now()) || shot.Platform != "linux" {
			t.Errorf("taken_at %v platform %q", shot.TakenAt, shot.Platform)
		}
	}
	// Without an index, the agent's DISPLAY.
	t.Setenv("DISPLAY", fmt.Sprintf(":%d", n))
	shot, err := c.Capture(context.Background(), nil)
	if err != nil || shot.Display != fmt.Sprintf(":%d", n) {
		t.Fatalf("default display: %v %+v", err, shot)
	}
}

func TestScreenshotMissing(t *testing.T) {
	c, srv := machine(t)
	free := -1
	for i := 999; i > 500; i-- {
		if _, err := os.Stat(fmt.Sprintf("/tmp/.X11-unix/X%d", i)); os.IsNotExist(err) {
			free = i
			break
		}
	}
	_, err := c.Capture(context.Background(), &free)
	if e, ok := errcode.As(err); !ok || e.Code != errcode.UnsupportedOp || e.Details["missing"] != "display" ||
		!strings.Contains(e.Message, fmt.Sprintf(":%d", free)) {
		t.Errorf("no display: %v", err)
	}
	// Bad indexes never reach a display.
	for _, q := range []string{"-1", "1000", "x", "1.5"} {
		resp, err := http.Get(srv.URL + "/screenshot?display=" + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("display=%s: HTTP %d", q, resp.StatusCode)
		}
	}
	bad := -1
	if _, err := c.Capture(context.Background(), &bad); errcode.Of(err) != errcode.InvalidArgument {
		t.Errorf("display -1: %v", err)
	}
}

// TestScreenshotPermission: an X server that wants a cookie the agent lacks is "permission";
// given the cookie (XAUTHORITY), the same display is captured.
func TestScreenshotPermission(t *testing.T) {
	dir := t.TempDir()
	auth := filepath.Join(dir, "xauth")
	cookie := make([]byte, 16)
	_, _ = rand.Read(cookie)
	if err := os.WriteFile(auth, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	n := xvfbWithCookie(t, auth, hex.EncodeToString(cookie))
	empty := filepath.Join(dir, "empty")
	_ = os.WriteFile(empty, nil, 0o600)
	t.Setenv("XAUTHORITY", empty)
	c, _ := machine(t)
	_, err := c.Capture(context.Background(), &n)
	if e, ok := errcode.As(err); !ok || e.Code != errcode.UnsupportedOp || e.Details["missing"] != "permission" {
		t.Fatalf("no cookie: %v", err)
	}
	t.Setenv("XAUTHORITY", auth)
	setRoot(t, n, "#0000ff", "XAUTHORITY="+auth)
	shot, err := c.Capture(context.Background(), &n)
	if err != nil {
		t.Fatal(err)
	}
	assertSolid(t, shot, 64, 48, [3]uint8{0, 0, 255})
}

// xvfbWithCookie starts Xvfb on a free display number that requires the MIT-MAGIC-COOKIE-1 in
// auth (written for that number before the server starts).
func xvfbWithCookie(t *testing.T, auth, cookie string) int {
	t.Helper()
	for n := 640; n < 700; n++ {
		if _, err := os.Stat(fmt.Sprintf("/tmp/.X%d-lock", n)); err == nil {
			continue
		}
		if out, err := exec.Command("xauth", "-f", auth, "add", fmt.Sprintf(":%d", n), "MIT-MAGIC-COOKIE-1", cookie).CombinedOutput(); err != nil {
			t.Fatalf("xauth: %v %s", err, out)
		}
		cmd := exec.Command("Xvfb", fmt.Sprintf(":%d", n), "-auth", auth, "-screen", "0", "64x48x24", "-nolisten", "tcp", "-noreset")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		sock := fmt.Sprintf("/tmp/.X11-unix/X%d", n)
		for range 200 {
			if _, err := os.Stat(sock); err == nil {
				time.Sleep(100 * time.Millisecond)
				return n
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("Xvfb :%d did not start", n)
	}
	t.Fatal("no free display number")
	return 0
}

// TestClientChecksTheMachine: a reply whose PNG is not what it claims, or whose fields are out
// of bounds, is refused.
func TestClientChecksTheMachine(t *testing.T) {
	var buf bytes.Buffer
	_ = png.Encode(&buf, image.NewRGBA(image.Rect(0, 0, 4, 3)))
	good := func() map[string]any {
		return map[string]any{"png": buf.Bytes(), "display": ":0", "screen": 0, "screens": 1, "width": 4, "height": 3,
			"taken_at": time.Now().UTC(), "platform": "linux"}
	}
	for name, mut := range map[string]func(m map[string]any){
		"ok":           func(map[string]any) {},
		"size lie":     func(m map[string]any) { m["width"] = 5 },
		"not png":      func(m map[string]any) { m["png"] = []byte("GIF89a") },
		"screen range": func(m map[string]any) { m["screen"] = 1 },
		"platform":     func(m map[string]any) { m["platform"] = "plan9" },
		"no time":      func(m map[string]any) { delete(m, "taken_at") },
	} {
		m := good()
		mut(m)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _ = json.NewEncoder(w).Encode(m) }))
		tr := srv.Client().Transport.(*http.Transport).Clone()
		tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
		}
		_, err := screenshot.NewClient(&http.Client{Transport: tr}).Capture(context.Background(), nil)
		srv.Close()
		if (name == "ok") != (err == nil) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
