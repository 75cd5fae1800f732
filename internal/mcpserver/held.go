package mcpserver

import (
	"context"
	"sync"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// heldSet is "the sandboxes this server created": sandbox_list, agentbox://sandboxes and health
// read it. A sandbox leaves it the first time the server reports it finished (destroyed,
// failed, lost — expiry is a destroy) to a client, so each end is reported once.
type heldSet struct {
	mu    sync.Mutex
	next  int64
	order map[string]int64 // id → creation order
}

func newHeldSet() *heldSet { return &heldSet{order: map[string]int64{}} }

func (h *heldSet) add(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	h.order[id] = h.next
}

func (h *heldSet) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.order)
}

func (h *heldSet) has(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.order[id]
	return ok
}

func (h *heldSet) drop(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.order, id)
}

// seen records that a client was told sb's state: a finished sandbox drops out.
func (h *heldSet) seen(sb sandbox.Sandbox) {
	if finished(sb.State) {
		h.drop(sb.ID)
	}
}

// ids returns the held ids in creation order.
func (h *heldSet) ids() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]string, 0, len(h.order))
	for id := range h.order {
		ids = append(ids, id)
	}
	// Insertion sort by creation order: the set is small (bounded by the live bound).
	for i := 1; i < len(ids); i++ {
		for j := i; j > 0 && h.order[ids[j]] < h.order[ids[j-1]]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
	return ids
}

// heldList reads the current state of every held sandbox, reports each finished one once (with
// why it ended) and drops it. It is never cut short: a held sandbox missing from the bulk
// listing is read one by one.
func (s *Server) heldList(ctx context.Context) (SandboxList, error) {
	out := SandboxList{Sandboxes: []SandboxInfo{}}
	ids := s.held.ids()
	if len(ids) == 0 {
		return out, nil
	}
	// One bulk read of every sandbox that is not destroyed, then point reads for the rest.
	all, err := s.b.List(ctx, sandbox.ListFilter{Limit: sandbox.MaxList})
	if err != nil {
		return out, err
	}
	byID := make(map[string]sandbox.Sandbox, len(all))
	for _, sb := range all {
		byID[sb.ID] = sb
	}
	var seen []sandbox.Sandbox
	for _, id := range ids {
		sb, ok := byID[id]
		if !ok {
			if sb, err = s.b.Get(ctx, id); errcode.Is(err, errcode.SandboxNotFound) {
				s.held.drop(id) // its record was pruned long after it ended
				continue
			} else if err != nil {
				return out, err
			}
		}
		out.Sandboxes = append(out.Sandboxes, s.withReason(ctx, s.info(sb)))
		seen = append(seen, sb)
	}
	for _, sb := range seen {
		s.held.seen(sb)
	}
	out.Count = len(out.Sandboxes)
	return out, nil
}

// Adopt adds every live sandbox of the control plane to the held set. A server that owns its
// control plane (agentbox serve, or agentbox mcp running one in-process) calls it at start, so
// that after a restart "the sandboxes this server created" still lists the ones that survived.
func (s *Server) Adopt(ctx context.Context) error {
	live, err := s.b.List(ctx, sandbox.ListFilter{States: []sandbox.State{sandbox.StateCreating, sandbox.StateRunning}, Limit: sandbox.MaxList})
	if err != nil {
		return err
	}
	for _, sb := range live {
		s.held.add(sb.ID)
	}
	return nil
}
