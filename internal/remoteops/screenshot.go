package remoteops

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/screenshot"
)

// callTimeout bounds one remote_screenshot call end to end.
const callTimeout = 55 * time.Second

// Screenshots takes screenshots of joined machines; the REST, MCP and CLI surfaces call it.
type Screenshots struct{ machines Machines }

// NewScreenshots returns a Screenshots over machines.
func NewScreenshots(machines Machines) *Screenshots { return &Screenshots{machines: machines} }

// Capture takes a screenshot of display (nil: the machine's default) on the machine ref names.
func (s *Screenshots) Capture(ctx context.Context, ref string, display *int) (*screenshot.Shot, error) {
	if display != nil && (*display < 0 || *display > screenshot.MaxDisplay) {
		return nil, errcode.New(errcode.InvalidArgument, "display %d is out of range: give 0–%d (0 is the first display; omit it for the machine's default)", *display, screenshot.MaxDisplay)
	}
	hc, _, err := s.machines.Client(ctx, ref)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return screenshot.NewClient(hc).Capture(ctx, display)
}
