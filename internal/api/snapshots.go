package api

import (
	"net/http"
	"net/url"
	"strconv"

	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/text"
	"github.com/agentbox/agentbox/internal/wire"
)

// Snapshots, fork, sleep, wake and diff: /v1/sandboxes/{id}/snapshots, /fork,
// /sleep, /wake, /diff and /v1/snapshots. Thin: the bounds of every number are checked here
// (refused, never clamped) and the service does the rest.

// Bounds of the snapshot and diff routes.
const (
	// DefaultSnapshotPage and MaxSnapshotPage bound a page of GET /v1/snapshots.
	DefaultSnapshotPage = 100
	MaxSnapshotPage     = 1000
	// MaxDiffPage bounds a page of changes (limit); MaxDiffBytes the unified diff
	// (max_diff_bytes).
	MaxDiffPage  = 10000
	MaxDiffBytes = 1 << 20
	// MaxIDArg bounds an id given as an argument (snapshot_id, other_sandbox_id, cursor).
	MaxIDArg = 256
)

// SnapshotList is the reply of GET /v1/snapshots and GET /v1/sandboxes/{id}/snapshots.
type SnapshotList = wire.SnapshotList

// DeletedSnapshot is the reply of DELETE /v1/snapshots/{snapshot_id}.
type DeletedSnapshot struct {
	SnapshotID string `json:"snapshot_id"`
	Deleted    bool   `json:"deleted"`
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req sandbox.SnapshotRequest
	if r.ContentLength != 0 { // the body is optional: {} takes a files snapshot
		if err := decode(w, r, &req); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	snap, err := s.snaps.Snapshot(r.Context(), r.PathValue("id"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, wireSnapshot(snap))
}

func (s *Server) listSandboxSnapshots(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, err := s.svc.Get(r.Context(), id); err != nil {
		s.fail(w, r, err)
		return
	}
	s.listSnapshotsFor(w, r, id)
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	s.listSnapshotsFor(w, r, r.URL.Query().Get("sandbox_id"))
}

func (s *Server) listSnapshotsFor(w http.ResponseWriter, r *http.Request, sandboxID string) {
	q := r.URL.Query()
	f := sandbox.SnapshotFilter{SandboxID: sandboxID, After: q.Get("cursor"), Limit: DefaultSnapshotPage}
	f.Principal, _ = authz.ListPrincipal(r.Context()) // an admin's lists show every snapshot
	if err := checkIDArg("sandbox_id", f.SandboxID); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := checkIDArg("cursor", f.After); err != nil {
		s.fail(w, r, err)
		return
	}
	lim, err := boundedParam(q, "limit", 1, MaxSnapshotPage)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f.Limit = int(ptrOr(lim, DefaultSnapshotPage))
	list, err := s.snaps.ListSnapshots(r.Context(), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snapshotPage(list, f.Limit))
}

// snapshotPage is a page of list at most limit long, with a cursor when it is full.
func snapshotPage(list []sandbox.Snapshot, limit int) SnapshotList {
	if len(list) > limit {
		list = list[:limit]
	}
	out := SnapshotList{Snapshots: convSlice(list, wireSnapshot), Count: len(list)}
	if out.Snapshots == nil {
		out.Snapshots = []wire.Snapshot{}
	}
	if limit > 0 && len(list) == limit {
		out.NextCursor = list[len(list)-1].ID
	}
	return out
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	snap, err := s.snaps.GetSnapshot(r.Context(), r.PathValue("snapshot_id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wireSnapshot(snap))
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("snapshot_id")
	if err := s.snaps.DeleteSnapshot(r.Context(), id); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, DeletedSnapshot{SnapshotID: id, Deleted: true})
}

// CheckFork checks a fork's numbers and ids at the edge: count 0–MaxForkCount (0: 1),
// ttl_seconds ≥ 0.
func CheckFork(req sandbox.ForkRequest) error {
	if req.Count < 0 || req.Count > sandbox.MaxForkCount {
		return errcode.New(errcode.InvalidArgument, "count must be between 1 and %d; got %d", sandbox.MaxForkCount, req.Count)
	}
	if req.TTLSeconds < 0 {
		return errcode.New(errcode.InvalidArgument, "ttl_seconds must be at least 1 (or omitted for the server's default); got %d", req.TTLSeconds)
	}
	if req.SnapshotID != "" && req.Memory {
		return errcode.New(errcode.InvalidArgument, "memory applies to a snapshot taken now: give snapshot_id or memory, not both (an existing snapshot's kind says whether it holds memory)")
	}
	return checkIDArg("snapshot_id", req.SnapshotID)
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	var req sandbox.ForkRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	if err := CheckFork(req); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := s.snaps.Fork(r.Context(), r.PathValue("id"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	for i := range res.Sandboxes {
		s.withHardening(&res.Sandboxes[i])
	}
	writeJSON(w, http.StatusCreated, wire.ForkResult{SnapshotID: res.SnapshotID, Kind: res.Kind, Sandboxes: wireSandboxes(res.Sandboxes)})
}

func (s *Server) sleepSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.svc.Sleep(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.withHardening(&sb)
	writeJSON(w, http.StatusOK, wireSandbox(sb))
}

func (s *Server) wakeSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.svc.Wake(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.withHardening(&sb)
	writeJSON(w, http.StatusOK, wireSandbox(sb))
}

// CheckDiff checks a diff request at the edge: at most one of other_sandbox_id and
// snapshot_id, limit 0–MaxDiffPage (0: the default), max_diff_bytes 0–MaxDiffBytes.
func CheckDiff(req sandbox.DiffRequest) error {
	if req.OtherSandboxID != "" && req.SnapshotID != "" {
		return errcode.New(errcode.InvalidArgument, "give other_sandbox_id or snapshot_id (or neither, to compare with the image), not both")
	}
	if req.Limit < 0 || req.Limit > MaxDiffPage {
		return errcode.New(errcode.InvalidArgument, "limit must be between 1 and %d; got %d", MaxDiffPage, req.Limit)
	}
	if req.MaxDiffBytes < 0 || req.MaxDiffBytes > MaxDiffBytes {
		return errcode.New(errcode.InvalidArgument, "max_diff_bytes must be between 1 and %d; got %d", MaxDiffBytes, req.MaxDiffBytes)
	}
	for _, a := range [][2]string{{"other_sandbox_id", req.OtherSandboxID}, {"snapshot_id", req.SnapshotID}, {"cursor", req.Cursor}} {
		if err := checkIDArg(a[0], a[1]); err != nil {
			return err
		}
	}
	return nil
}

// diffQuery reads GET …/diff's query parameters.
func diffQuery(q url.Values) (sandbox.DiffRequest, error) {
	req := sandbox.DiffRequest{OtherSandboxID: q.Get("other_sandbox_id"), SnapshotID: q.Get("snapshot_id"), Cursor: q.Get("cursor")}
	lim, err := boundedParam(q, "limit", 1, MaxDiffPage)
	if err != nil {
		return req, err
	}
	req.Limit = int(ptrOr(lim, 0))
	mdb, err := boundedParam(q, "max_diff_bytes", 1, MaxDiffBytes)
	if err != nil {
		return req, err
	}
	req.MaxDiffBytes = ptrOr(mdb, 0)
	if v := q.Get("no_unified"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return req, errcode.New(errcode.InvalidArgument, "no_unified must be true or false; got %q", text.Truncate(v, 32))
		}
		req.NoUnified = b
	}
	return req, nil
}

func (s *Server) diffSandbox(w http.ResponseWriter, r *http.Request) {
	var req sandbox.DiffRequest
	var err error
	if r.Method == http.MethodGet {
		req, err = diffQuery(r.URL.Query())
	} else if r.ContentLength != 0 {
		err = decode(w, r, &req)
	}
	if err == nil {
		err = CheckDiff(req)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := s.snaps.Diff(r.Context(), r.PathValue("id"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if res.Changes == nil {
		res.Changes = []sandbox.DiffChange{}
	}
	writeJSON(w, http.StatusOK, res)
}

// checkIDArg bounds an id-like argument's length.
func checkIDArg(name, v string) error {
	if len(v) > MaxIDArg {
		return errcode.New(errcode.InvalidArgument, "%s must be at most %d bytes; got %d", name, MaxIDArg, len(v))
	}
	return nil
}
