// Package screenshot is remote_screenshot on a joined machine: the handler its agent serves at
// /screenshot (X11 on Linux through a pure-Go X client; screencapture on macOS and PowerShell
// with System.Drawing on Windows behind build tags), the Client the server calls it with (which
// checks the PNG and every field before anything is believed). The server's service is
// internal/remoteops.
//
// Wire: GET /screenshot?display=N → 200 {"png": base64, "display", "screen", "screens",
// "displays", "width", "height", "taken_at", "platform"}, or a typed error; a machine with no
// display, or whose agent may not read it, answers UNSUPPORTED_OPERATION with
// details.missing = "display" | "permission".
package screenshot

import (
	"fmt"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Bounds of a request and of a reply.
const (
	// MaxDisplay is the largest display index a request may name.
	MaxDisplay = 999
	// MaxSide bounds a captured image's width and height; MaxPixels their product.
	MaxSide   = 16384
	MaxPixels = 64 << 20
	// MaxPNGBytes bounds the PNG a machine may send.
	MaxPNGBytes = 48 << 20
	// maxReply bounds the JSON reply: the PNG in base64 and the short fields.
	maxReply     = (MaxPNGBytes+2)/3*4 + 64<<10
	maxDisplays  = 64
	maxNameBytes = 64
	// captureTimeout bounds one capture on the machine.
	captureTimeout = 20 * time.Second
)

// Shot is one screenshot.
type Shot struct {
	PNG []byte `json:"png"`
	// Display names what was captured: ":1" on X11, "1" (screencapture -D) on macOS,
	// "\\.\DISPLAY1" on Windows.
	Display string `json:"display"`
	// Screen is the index of the screen (monitor) captured, of Screens.
	Screen  int `json:"screen"`
	Screens int `json:"screens"`
	// Displays lists the displays the machine has (on X11 the server sockets found), when known.
	Displays []string  `json:"displays,omitempty"`
	Width    int       `json:"width"`
	Height   int       `json:"height"`
	TakenAt  time.Time `json:"taken_at"`
	Platform string    `json:"platform"`
}

// Caption says what the image is: which display, how many there are, the resolution and when it
// was taken.
func (s *Shot) Caption() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s display %s, screen %d of %d, %d×%d pixels, taken %s", platformName(s.Platform), s.Display,
		s.Screen, s.Screens, s.Width, s.Height, s.TakenAt.UTC().Format(time.RFC3339))
	if len(s.Displays) > 0 {
		fmt.Fprintf(&b, "; displays on the machine: %s", strings.Join(s.Displays, ", "))
	}
	return b.String()
}

func platformName(p string) string {
	switch p {
	case "linux":
		return "X11"
	case "darwin":
		return "macOS"
	case "windows":
		return "Windows"
	}
	return p
}

// noDisplay is the reply of a machine with no display to capture.
func noDisplay(format string, args ...any) error {
	return errcode.New(errcode.UnsupportedOp, "no display: "+format, args...).With("missing", "display")
}

// noPermission is the reply of a machine whose agent may not capture the display.
func noPermission(format string, args ...any) error {
	return errcode.New(errcode.UnsupportedOp, "no permission: "+format, args...).With("missing", "permission")
}

// checkSize refuses an image too large to capture.
func checkSize(w, h int) error {
	if w <= 0 || h <= 0 || w > MaxSide || h > MaxSide || w*h > MaxPixels {
		return errcode.New(errcode.UnsupportedOp, "the display is %d×%d pixels; screenshots are limited to %d pixels a side and %d in all", w, h, MaxSide, MaxPixels)
	}
	return nil
}
