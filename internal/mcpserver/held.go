package mcpserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Owners. Every MCP client session is an owner: the sandboxes it creates are recorded with it
// (sandbox.WithOwner), its idempotency keys are scoped to it, and "the sandboxes this server
// created" (sandbox_list, agentbox://sandboxes, health) is kept per owner, so one client never
// consumes another's report that a sandbox finished.
//
//   - a session with an id that lasts across requests (streamable HTTP and SSE under the
//     session-based protocol versions): "mcp-session:" + its id;
//   - a connection without session ids (stdio, in-memory): the process, "mcp-process:" + a
//     random id made when the Server is;
//   - a request under the per-request protocol (2026-07-28) over HTTP has no session: the HTTP
//     identity the embedding server put on the request (api: the token's owner), else the
//     process.
func (s *Server) ownerOf(ctx context.Context, ss *mcp.ServerSession) (owner string, session bool) {
	switch {
	case ss == nil || ss.ID() == "":
		return s.processOwner, false
	case ss.InitializeParams() != nil:
		return "mcp-session:" + ss.ID(), true
	}
	if o := sandbox.OwnerFrom(ctx); o != "" {
		return o, false
	}
	return s.processOwner, false
}

func newProcessOwner() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "mcp-process:" + hex.EncodeToString(b[:])
}

// heldSets is "the sandboxes this server created", per owner. A sandbox leaves an owner's set the
// first time the server reports it finished (destroyed, failed, lost — expiry is a destroy) to
// that owner, so each end is reported once to the client that made the sandbox. Sandboxes
// adopted at start (Adopt) are in every owner's set until that owner is told they ended.
type heldSets struct {
	mu      sync.Mutex
	next    int64
	sets    map[string]*heldSet
	session map[string]bool  // owners that are sessions: dropped when the session ends
	adopted map[string]int64 // id → order, for sets made after Adopt
	total   int              // ids in all sets, bounded by maxHeld
}

type heldSet struct {
	order map[string]int64 // id → creation order
}

func newHeldSets() *heldSets {
	return &heldSets{sets: map[string]*heldSet{}, session: map[string]bool{}, adopted: map[string]int64{}}
}

// get returns owner's set, made (with the adopted sandboxes) on first use. Callers hold mu.
func (h *heldSets) get(owner string, session bool) *heldSet {
	hs := h.sets[owner]
	if hs == nil {
		hs = &heldSet{order: map[string]int64{}}
		for id, n := range h.adopted {
			hs.order[id] = n
			h.total++
		}
		h.sets[owner] = hs
		if session {
			h.session[owner] = true
		}
	}
	return hs
}

func (h *heldSets) full() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.total >= maxHeld
}

func (h *heldSets) add(owner string, session bool, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	hs := h.get(owner, session)
	if _, ok := hs.order[id]; !ok {
		h.total++
	}
	h.next++
	hs.order[id] = h.next
}

// adopt puts id in every set, and in the sets made later.
func (h *heldSets) adopt(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	h.adopted[id] = h.next
	for _, hs := range h.sets {
		if _, ok := hs.order[id]; !ok {
			hs.order[id] = h.next
			h.total++
		}
	}
}

// drop removes id from owner's set; a finished sandbox is no longer adopted by sets made later.
func (h *heldSets) drop(owner, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.adopted, id)
	if hs := h.sets[owner]; hs != nil {
		if _, ok := hs.order[id]; ok {
			delete(hs.order, id)
			h.total--
		}
	}
}

// seen records that owner was told sb's state: a finished sandbox drops out of its set.
func (h *heldSets) seen(owner string, sb sandbox.Sandbox) {
	if finished(sb.State) {
		h.drop(owner, sb.ID)
	}
}

// ids returns owner's held ids in creation order.
func (h *heldSets) ids(owner string, session bool) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	hs := h.get(owner, session)
	ids := make([]string, 0, len(hs.order))
	for id := range hs.order {
		ids = append(ids, id)
	}
	// Insertion sort by creation order: a set is small (bounded by the live bound).
	for i := 1; i < len(ids); i++ {
		for j := i; j > 0 && hs.order[ids[j]] < hs.order[ids[j-1]]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
	return ids
}

// prune drops the sets of sessions that have ended (live holds the owners of live sessions).
func (h *heldSets) prune(live map[string]bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for owner := range h.session {
		if !live[owner] {
			h.total -= len(h.sets[owner].order)
			delete(h.sets, owner)
			delete(h.session, owner)
		}
	}
}

// pruneSessions forgets the held sets of sessions that have ended.
func (s *Server) pruneSessions() {
	live := map[string]bool{}
	for ss := range s.mcp.Sessions() {
		if ss.ID() != "" {
			live["mcp-session:"+ss.ID()] = true
		}
	}
	s.held.prune(live)
}

// heldList reads the current state of every sandbox owner holds, reports each finished one once
// (with why it ended) and drops it. It is never cut short: a held sandbox missing from the bulk
// listing is read one by one.
func (s *Server) heldList(ctx context.Context, ss *mcp.ServerSession) (SandboxList, error) {
	owner, session := s.ownerOf(ctx, ss)
	out := SandboxList{Sandboxes: []SandboxInfo{}}
	ids := s.held.ids(owner, session)
	if len(ids) == 0 {
		return out, nil
	}
	// One bulk read of every sandbox that is not destroyed, then point reads for the rest; a
	// key that is not admin sees only its principal's (sandboxes adopted at start included).
	principal, filtered := authz.ListPrincipal(ctx)
	all, err := s.b.List(ctx, sandbox.ListFilter{Limit: sandbox.MaxList, Principal: principal})
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
				s.held.drop(owner, id) // its record was pruned long after it ended
				continue
			} else if err != nil {
				return out, err
			}
		}
		if filtered && sb.Principal != principal {
			continue
		}
		out.Sandboxes = append(out.Sandboxes, s.withReason(ctx, s.info(sb)))
		seen = append(seen, sb)
	}
	for _, sb := range seen {
		s.held.seen(owner, sb)
	}
	out.Count = len(out.Sandboxes)
	return out, nil
}

// Adopt puts every live sandbox of the control plane in every owner's held set. A server that
// owns its control plane (agentbox serve, or agentbox mcp running one in-process) calls it at
// start, so that after a restart "the sandboxes this server created" still lists the ones that
// survived, to every client, until each is told they ended.
func (s *Server) Adopt(ctx context.Context) error {
	live, err := s.b.List(ctx, sandbox.ListFilter{States: []sandbox.State{sandbox.StateCreating, sandbox.StateRunning}, Limit: sandbox.MaxList})
	if err != nil {
		return err
	}
	for _, sb := range live {
		s.held.adopt(sb.ID)
	}
	return nil
}
