package screenshot

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/shell"
)

// captureScript copies screen N with System.Drawing into a PNG file and prints, as JSON, the
// number of screens and the captured screen's device name and bounds. Exit 3: no such screen.
const captureScript = `
$ErrorActionPreference = 'Stop'
Add-Type -AssemblyName System.Windows.Forms, System.Drawing
$all = [System.Windows.Forms.Screen]::AllScreens
if (%d -ge $all.Length) { [Console]::Out.Write((@{screens=$all.Length} | ConvertTo-Json -Compress)); exit 3 }
$s = $all[%d]
$b = $s.Bounds
$bmp = New-Object System.Drawing.Bitmap $b.Width, $b.Height
$g = [System.Drawing.Graphics]::FromImage($bmp)
$g.CopyFromScreen($b.Location, [System.Drawing.Point]::Empty, $b.Size)
$bmp.Save('%s', [System.Drawing.Imaging.ImageFormat]::Png)
$g.Dispose(); $bmp.Dispose()
[Console]::Out.Write((@{screens=$all.Length; name=$s.DeviceName} | ConvertTo-Json -Compress))
`

// capture runs PowerShell with System.Drawing. Untested here (the project's tests run on
// Linux): it needs the agent to run in an interactive desktop session; an agent running as a
// service (session 0) has no desktop to copy and gets the "permission" reply.
func capture(ctx context.Context, display *int) (*Shot, error) {
	idx := 0
	if display != nil {
		idx = *display
	}
	dir, err := os.MkdirTemp("", "agentbox-screenshot-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "shot.png")
	spec := shell.Command(shell.PowerShell, fmt.Sprintf(captureScript, idx, idx, strings.ReplaceAll(file, "'", "''")))
	cmd := exec.CommandContext(ctx, spec.Path, spec.Args[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	taken := time.Now().UTC()
	var info struct {
		Screens int    `json:"screens"`
		Name    string `json:"name"`
	}
	_ = json.Unmarshal(stdout.Bytes(), &info)
	errText, _ := shell.DecodeCLIXML(stderr.Bytes())
	msg := strings.TrimSpace(string(errText))
	if len(msg) > 300 {
		msg = msg[:300]
	}
	if err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			return nil, noDisplay("powershell.exe is not available: %v", err)
		}
		if cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == 3 {
			return nil, noDisplay("Windows has %d screen(s); there is no display %d", info.Screens, idx)
		}
		return nil, noPermission("copying the screen failed (%s); the agent must run in an interactive desktop session (a service in session 0 has no screen to copy)", msg)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, noPermission("no image was written (%s)", msg)
	}
	if len(b) > MaxPNGBytes {
		return nil, errcode.New(errcode.UnsupportedOp, "the screenshot is %d bytes as PNG; at most %d", len(b), MaxPNGBytes)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("System.Drawing wrote a file that is not a PNG: %v", err)
	}
	if err := checkSize(cfg.Width, cfg.Height); err != nil {
		return nil, err
	}
	name := info.Name
	if name == "" {
		name = strconv.Itoa(idx)
	}
	return &Shot{PNG: b, Display: name, Screen: idx, Screens: max(info.Screens, idx+1), Width: cfg.Width, Height: cfg.Height, TakenAt: taken}, nil
}
