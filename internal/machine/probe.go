package machine

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/machine/agent"
)

// maxProbeReply bounds GET /agent/info's reply.
const maxProbeReply = 16 << 10

// Probe asks machine ref's agent who it is (GET /agent/info over a new stream of its session),
// within 10 s. The reply is bounded and checked like any machine's.
func (r *Registry) Probe(ctx context.Context, ref string) (agent.Info, error) {
	hc, m, err := r.Client(ctx, ref)
	if err != nil {
		return agent.Info{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://machine/agent/info", nil)
	if err != nil {
		return agent.Info{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		if errcode.Of(err) == errcode.MachineOffline {
			return agent.Info{}, err
		}
		return agent.Info{}, errcode.Wrap(errcode.MachineOffline, err, "machine %s (%s) did not answer: %v", m.Name, m.ID, err).With("machine_id", m.ID)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxProbeReply+1))
	bad := func(why string) (agent.Info, error) {
		return agent.Info{}, errcode.New(errcode.Internal, "machine %s (%s) answered GET /agent/info with %s", m.Name, m.ID, why)
	}
	switch {
	case err != nil:
		return bad(fmt.Sprintf("a broken body: %v", err))
	case len(b) > maxProbeReply:
		return bad(fmt.Sprintf("more than %d bytes", maxProbeReply))
	case resp.StatusCode != http.StatusOK:
		return bad(fmt.Sprintf("HTTP %d", resp.StatusCode))
	}
	var info agent.Info
	if err := json.Unmarshal(b, &info); err != nil {
		return bad("a reply that is not its info JSON")
	}
	for _, s := range []string{info.Hostname, info.Platform, info.Arch, info.AgentVersion} {
		if len(s) > 255 || !utf8.ValidString(s) || strings.ContainsAny(s, "\x00\n\r") {
			return bad("a field longer than 255 bytes or not printable UTF-8")
		}
	}
	if info.PID < 0 {
		return bad("a negative pid")
	}
	return info, nil
}
