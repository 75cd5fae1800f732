package screenshot

import (
	"bytes"
	"context"
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
)

// capture runs `screencapture -x -D N+1` (no sound; macOS numbers displays from 1). Untested
// here (the project's tests run on Linux): macOS asks for the Screen Recording permission,
// without which screencapture fails or captures only the desktop background.
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
	out, err := exec.CommandContext(ctx, "screencapture", "-x", "-t", "png", "-D", strconv.Itoa(idx+1), file).CombinedOutput()
	taken := time.Now().UTC()
	text := strings.TrimSpace(string(out))
	if err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			return nil, noDisplay("screencapture is not available on this Mac: %v", err)
		}
		if strings.Contains(text, "Invalid display") || strings.Contains(text, "invalid display") {
			return nil, noDisplay("macOS has no display %d (screencapture: %s)", idx, text)
		}
		return nil, noPermission("screencapture failed (%s); the agent's process needs the Screen Recording permission (System Settings → Privacy & Security) and a logged-in GUI session", text)
	}
	b, err := os.ReadFile(file)
	if err != nil || len(b) == 0 {
		return nil, noPermission("screencapture wrote no image (%s); the agent's process needs the Screen Recording permission and a logged-in GUI session", text)
	}
	if len(b) > MaxPNGBytes {
		return nil, errcode.New(errcode.UnsupportedOp, "the screenshot is %d bytes as PNG; at most %d", len(b), MaxPNGBytes)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("screencapture wrote a file that is not a PNG: %v", err)
	}
	if err := checkSize(cfg.Width, cfg.Height); err != nil {
		return nil, err
	}
	return &Shot{PNG: b, Display: strconv.Itoa(idx + 1), Screen: idx, Screens: max(idx+1, 1), Width: cfg.Width, Height: cfg.Height, TakenAt: taken}, nil
}
