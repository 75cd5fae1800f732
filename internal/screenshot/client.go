package screenshot

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/peerreply"
	"github.com/agentbox/agentbox/internal/text"
)

var errorCodes = []errcode.Code{errcode.InvalidArgument, errcode.UnsupportedOp, errcode.Internal}

// Client calls a machine's /screenshot over an *http.Client whose transport reaches the machine.
type Client struct {
	hc   *http.Client
	base string
}

// NewClient returns a Client over hc, at base URL "http://machine".
func NewClient(hc *http.Client) *Client { return &Client{hc: hc, base: "http://machine"} }

// Capture takes a screenshot of display (nil: the machine's default) and checks it: the PNG
// decodes to the size the machine claims, and every field is within its bounds.
func (c *Client) Capture(ctx context.Context, display *int) (*Shot, error) {
	q := ""
	if display != nil {
		if *display < 0 || *display > MaxDisplay {
			return nil, errcode.New(errcode.InvalidArgument, "display %d is out of range: give 0–%d", *display, MaxDisplay)
		}
		q = "?" + url.Values{"display": {strconv.Itoa(*display)}}.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/screenshot"+q, nil)
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "building the screenshot request")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if typed, ok := errcode.As(err); ok {
			return nil, typed
		}
		return nil, errcode.Wrap(errcode.MachineOffline, err, "could not reach the machine: %s", text.Clean(err.Error(), 200))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, peerreply.Machine.ReadError(resp, "screenshot", errorCodes...)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxReply+1))
	if err != nil {
		return nil, errcode.Wrap(errcode.MachineOffline, err, "the connection to the machine broke during the screenshot")
	}
	if len(raw) > maxReply {
		return nil, peerreply.Machine.Malformedf("screenshot", "more than %d bytes", maxReply)
	}
	var s Shot
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, peerreply.Machine.Malformedf("screenshot", "not JSON: %v", err)
	}
	if err := check(&s); err != nil {
		return nil, err
	}
	return &s, nil
}

// check bounds and verifies what a machine sent.
func check(s *Shot) error {
	bad := func(format string, args ...any) error {
		return peerreply.Machine.Malformedf("screenshot", format, args...)
	}
	if len(s.PNG) == 0 || len(s.PNG) > MaxPNGBytes {
		return bad("a PNG of %d bytes (1–%d)", len(s.PNG), MaxPNGBytes)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(s.PNG))
	if err != nil {
		return bad("an image that is not a PNG: %v", err)
	}
	if cfg.Width != s.Width || cfg.Height != s.Height || checkSize(s.Width, s.Height) != nil {
		return bad("a %d×%d PNG said to be %d×%d", cfg.Width, cfg.Height, s.Width, s.Height)
	}
	if s.Screens < 1 || s.Screens > maxDisplays || s.Screen < 0 || s.Screen >= s.Screens {
		return bad("screen %d of %d", s.Screen, s.Screens)
	}
	if len(s.Displays) > maxDisplays {
		return bad("%d displays", len(s.Displays))
	}
	for i, d := range s.Displays {
		s.Displays[i] = text.Clean(d, maxNameBytes)
	}
	s.Display = text.Clean(s.Display, maxNameBytes)
	switch s.Platform {
	case "linux", "darwin", "windows":
	default:
		return bad("platform %q", text.Clean(s.Platform, 32))
	}
	if s.TakenAt.IsZero() || s.TakenAt.Year() < 2000 || s.TakenAt.After(time.Now().Add(24*time.Hour)) {
		return bad("taken_at %v", s.TakenAt)
	}
	return nil
}
