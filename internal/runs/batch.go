package runs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Batch kinds.
const (
	KindBatch        = "batch"
	KindMatrix       = "matrix"
	KindAgentCompare = "agent_compare"
	KindAgentTest    = "agent_test"
)

// Batch bounds.
const (
	DefaultMaxParallel = 4
	MaxMaxParallel     = 64
	MaxBatchLabels     = 32
	MaxLabelKey        = 63
	MaxLabelValue      = 255
	MaxIdempotencyKey  = 256
)

// batchItem is one spec of a batch, decoded and validated, or its submission failure.
type batchItem struct {
	spec Spec
	fail *SubmissionFailure
}

var batchIDPattern = regexp.MustCompile(`^batch-[0-9a-f]{12}$`)

// checkBatchID refuses what newBatchID could not have made.
func checkBatchID(id string) error {
	if !batchIDPattern.MatchString(id) {
		return errcode.New(errcode.InvalidArgument, "batch_id %q is not a batch id (batch- and 12 hex digits)", trunc(id, 64)).With("field", "batch_id")
	}
	return nil
}

// newBatchID returns "batch-" and 12 lowercase hex digits.
func newBatchID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return "batch-" + hex.EncodeToString(b[:])
}

// checkBatchArgs checks what every batch form shares and returns max_parallel with its default.
func checkBatchArgs(maxParallel int, idemKey string, labels map[string]string) (int, error) {
	if maxParallel == 0 {
		maxParallel = DefaultMaxParallel
	}
	if maxParallel < 1 || maxParallel > MaxMaxParallel {
		return 0, errcode.New(errcode.InvalidArgument, "max_parallel is %d; it must be 1..%d (default %d)", maxParallel, MaxMaxParallel, DefaultMaxParallel).With("field", "max_parallel")
	}
	if len(idemKey) > MaxIdempotencyKey {
		return 0, errcode.New(errcode.InvalidArgument, "idempotency_key is %d bytes, at most %d", len(idemKey), MaxIdempotencyKey)
	}
	if len(labels) > MaxBatchLabels {
		return 0, errcode.New(errcode.InvalidArgument, "labels: %d labels, at most %d", len(labels), MaxBatchLabels)
	}
	for k, v := range labels {
		if k == "" || len(k) > MaxLabelKey {
			return 0, errcode.New(errcode.InvalidArgument, "labels: key %q must be 1..%d bytes", k, MaxLabelKey)
		}
		if len(v) > MaxLabelValue {
			return 0, errcode.New(errcode.InvalidArgument, "labels[%q]: value is %d bytes, at most %d", k, len(v), MaxLabelValue)
		}
	}
	return maxParallel, nil
}

// decodeItem decodes one raw spec strictly (unknown fields refused) and validates it; what is
// wrong with it becomes its submission failure, named by where (e.g. "runs[3]").
func (s *Service) decodeItem(where string, raw json.RawMessage) batchItem {
	var spec Spec
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	err := d.Decode(&spec)
	if err == nil && d.More() {
		err = errors.New("trailing data after the spec")
	}
	if err != nil || len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		msg := "missing spec"
		if err != nil {
			msg = err.Error()
		}
		return batchItem{fail: &SubmissionFailure{Error: fmt.Sprintf("%s: not a run spec: %s", where, msg), Code: string(errcode.InvalidArgument)}}
	}
	return s.checkItem(where, spec)
}

// checkItem validates a spec with the runner's validator (defaults applied).
func (s *Service) checkItem(where string, spec Spec) batchItem {
	if spec.IdempotencyKey != "" {
		// A batch's runs are made in one transaction with the batch: one key already taken
		// would refuse the whole batch. The batch's own idempotency_key makes it safe to retry.
		return batchItem{fail: &SubmissionFailure{Error: where + ": spec.idempotency_key: not allowed in a batch's run; give the batch an idempotency_key instead",
			Code: string(errcode.InvalidArgument)}}
	}
	v, err := s.validate(spec)
	if err != nil {
		return batchItem{fail: &SubmissionFailure{Error: where + ": " + errcode.Message(err), Code: string(errcode.Of(err))}}
	}
	return batchItem{spec: v}
}

// StartBatch records a batch and its runs (bad specs become submission failures, in the order
// given, never runs).
func (s *Service) StartBatch(ctx context.Context, req BatchRequest) (Batch, error) {
	maxPar, err := checkBatchArgs(req.MaxParallel, req.IdempotencyKey, req.Labels)
	if err != nil {
		return Batch{}, err
	}
	if len(req.Runs) == 0 {
		return Batch{}, errcode.New(errcode.InvalidArgument, "runs: give 1..%d run specs", MaxBatchRuns).With("field", "runs")
	}
	if len(req.Runs) > MaxBatchRuns {
		return Batch{}, errcode.New(errcode.InvalidArgument, "runs: %d specs, at most %d", len(req.Runs), MaxBatchRuns).With("field", "runs")
	}
	items := make([]batchItem, len(req.Runs))
	for i, raw := range req.Runs {
		items[i] = s.decodeItem(fmt.Sprintf("runs[%d]", i), raw)
	}
	b := Batch{Kind: KindBatch, MaxParallel: maxPar, IdempotencyKey: req.IdempotencyKey, Labels: req.Labels}
	return s.createBatch(ctx, b, items)
}

// createBatch records b with a run for each valid item (Index = the item's position) and a
// submission failure for each other one, in one store transaction, then wakes the dispatcher.
// b.Matrix cells and b.Compare repetitions get their run ids here.
func (s *Service) createBatch(ctx context.Context, b Batch, items []batchItem) (Batch, error) {
	now := s.now().UTC()
	b.ID = newBatchID()
	b.Owner = sandbox.OwnerFrom(ctx)
	b.CreatedAt = now
	b.Version = 1
	b.Runs = []BatchRun{}
	b.SubmissionFailures = []SubmissionFailure{}
	var runs []Run
	var evs []Event
	for i, it := range items {
		if it.fail != nil {
			f := *it.fail
			f.Index = i
			b.SubmissionFailures = append(b.SubmissionFailures, f)
			continue
		}
		r := s.newRun(ctx, it.spec, b.ID)
		runs = append(runs, r)
		evs = append(evs, s.firstEvent(r))
		b.Runs = append(b.Runs, BatchRun{RunID: r.ID, Index: i, State: r.State})
		if i < len(b.Matrix) {
			b.Matrix[i].RunID = r.ID
		}
		setCompareRunID(b.Compare, i, r.ID)
	}
	b.Counts = map[State]int{}
	if len(runs) > 0 {
		b.Counts[Queued] = len(runs)
	} else {
		// Nothing to run: the batch is settled at once, its reply shows the failures.
		b.Settled = true
		b.SettledAt = &now
	}
	got, created, err := s.store.CreateBatch(ctx, b, runs, evs)
	if err != nil {
		return Batch{}, err
	}
	if !created {
		return s.fillBatch(ctx, got)
	}
	s.log.InfoContext(ctx, "batch recorded", "batch", b.ID, "kind", b.Kind, "runs", len(runs),
		"submission_failures", len(b.SubmissionFailures), "max_parallel", b.MaxParallel)
	if len(runs) > 0 {
		s.wake()
	}
	return s.fillBatch(ctx, got)
}

// GetBatch returns a batch with its runs' current states (and its comparison or matrix
// table filled).
func (s *Service) GetBatch(ctx context.Context, id string) (Batch, error) {
	if err := checkBatchID(id); err != nil {
		return Batch{}, err
	}
	b, err := s.store.GetBatch(ctx, id)
	if err != nil {
		return Batch{}, err
	}
	return s.fillBatch(ctx, b)
}

// batchRuns reads every run of a batch (at most MaxBatchRuns, one page).
func (s *Service) batchRuns(ctx context.Context, b Batch) (map[string]Run, error) {
	out := make(map[string]Run, len(b.Runs))
	if len(b.Runs) == 0 {
		return out, nil
	}
	list, err := s.store.ListRuns(ctx, Filter{BatchID: b.ID, Limit: MaxList})
	if err != nil {
		return nil, err
	}
	for _, r := range list.Runs {
		out[r.ID] = r
	}
	return out, nil
}

// fillBatch derives a batch's state from its runs: each run's state and reason, Counts, the
// matrix table, the comparison; Settled when every run is (recorded now if the hook has not yet).
func (s *Service) fillBatch(ctx context.Context, b Batch) (Batch, error) {
	runs, err := s.batchRuns(ctx, b)
	if err != nil {
		return Batch{}, err
	}
	counts := map[State]int{}
	settled := 0
	for i := range b.Runs {
		r, ok := runs[b.Runs[i].RunID]
		if !ok {
			// Pruned with its batch still listed (or not yet visible): report it as unknown.
			b.Runs[i].Reason = "the run's record is gone (pruned)"
			continue
		}
		b.Runs[i].State = r.State
		b.Runs[i].Reason = r.Reason
		counts[r.State]++
		if r.State.Settled() {
			settled++
		}
	}
	b.Counts = counts
	for i := range b.Matrix {
		c := &b.Matrix[i]
		r, ok := runs[c.RunID]
		if !ok {
			continue
		}
		c.State = r.State
		c.ExitCodes = map[string]*int{}
		for _, p := range r.Phases {
			c.ExitCodes[p.Name] = p.ExitCode
		}
	}
	if b.Compare != nil {
		fillComparison(b.Compare, runs)
	}
	if b.SubmissionFailures == nil {
		b.SubmissionFailures = []SubmissionFailure{}
	}
	if b.Runs == nil {
		b.Runs = []BatchRun{}
	}
	if !b.Settled && settled == len(b.Runs) {
		s.markSettled(ctx, b.ID)
		b.Settled = true
		if b.SettledAt == nil {
			now := s.now().UTC()
			b.SettledAt = &now
		}
	}
	return b, nil
}

// batchRunSettled is the hook the runner calls whenever a run settles: it records the batch's
// counts and, once every run settled, Settled and SettledAt.
func (s *Service) batchRunSettled(ctx context.Context, r Run) {
	if r.BatchID == "" {
		return
	}
	s.markSettled(ctx, r.BatchID)
}

// markSettled updates a batch's stored Counts and Settled from its runs, retrying on a version
// conflict (two runs settling at once).
func (s *Service) markSettled(ctx context.Context, id string) {
	for try := 0; try < 5; try++ {
		b, err := s.store.GetBatch(ctx, id)
		if err != nil {
			s.log.WarnContext(ctx, "batch update: read", "batch", id, "err", err)
			return
		}
		if b.Settled {
			return
		}
		counts, err := s.store.BatchCounts(ctx, id)
		if err != nil {
			s.log.WarnContext(ctx, "batch update: counts", "batch", id, "err", err)
			return
		}
		n, done := 0, 0
		for st, c := range counts {
			n += c
			if st.Settled() {
				done += c
			}
		}
		b.Counts = counts
		if n >= len(b.Runs) && done == n {
			now := s.now().UTC()
			b.Settled, b.SettledAt = true, &now
		}
		b.Version++
		err = s.store.UpdateBatch(ctx, b)
		if err == nil {
			if b.Settled {
				s.log.InfoContext(ctx, "batch settled", "batch", id, "counts", counts)
			}
			return
		}
		if !errcode.Is(err, errcode.Conflict) {
			s.log.WarnContext(ctx, "batch update", "batch", id, "err", err)
			return
		}
	}
	s.log.WarnContext(ctx, "batch update: gave up after repeated version conflicts", "batch", id)
}

// WaitBatch returns the batch once settled, or as it is when timeout (0..MaxWait) passes or
// ctx ends. While it waits it reads only the batch's record and counts (woken by every run
// change in this server, and every second); the full batch is read once at the end.
func (s *Service) WaitBatch(ctx context.Context, id string, timeout time.Duration) (Batch, error) {
	if err := checkBatchID(id); err != nil {
		return Batch{}, err
	}
	if timeout < 0 || timeout > MaxWait {
		return Batch{}, errcode.New(errcode.InvalidArgument, "wait must be between 0 and %s; got %s", MaxWait, timeout).With("field", "wait_seconds")
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		ch := s.changedCh()
		done, err := s.batchDone(ctx, id)
		if err != nil {
			return Batch{}, err
		}
		if done || timeout == 0 {
			return s.GetBatch(ctx, id)
		}
		select {
		case <-ch:
		case <-tick.C:
		case <-deadline.C:
			return s.GetBatch(ctx, id)
		case <-ctx.Done():
			return s.GetBatch(context.WithoutCancel(ctx), id)
		}
	}
}

// batchDone reports whether every run of the batch settled (from its record and counts).
func (s *Service) batchDone(ctx context.Context, id string) (bool, error) {
	b, err := s.store.GetBatch(ctx, id)
	if err != nil || b.Settled {
		return b.Settled, err
	}
	counts, err := s.store.BatchCounts(ctx, id)
	if err != nil {
		return false, err
	}
	n, settled := 0, 0
	for st, c := range counts {
		n += c
		if st.Settled() {
			settled += c
		}
	}
	return n >= len(b.Runs) && settled == n, nil
}

// ListBatches pages the batches of the owner on ctx (sandbox.OwnerFrom; "": every owner's:
// the REST handler puts authz.ListOwner there), newest first: summaries (kind, counts, settled,
// submission failures); GetBatch has each one's runs, matrix table and comparison.
func (s *Service) ListBatches(ctx context.Context, before string, limit int) (BatchList, error) {
	if limit == 0 {
		limit = DefaultList
	}
	if limit < 1 || limit > MaxList {
		return BatchList{}, errcode.New(errcode.InvalidArgument, "limit is %d; it must be 1..%d", limit, MaxList).With("field", "limit")
	}
	l, err := s.store.ListBatches(ctx, sandbox.OwnerFrom(ctx), before, limit)
	if err != nil {
		return BatchList{}, err
	}
	for i := range l.Batches {
		b := &l.Batches[i]
		if !b.Settled {
			counts, err := s.store.BatchCounts(ctx, b.ID)
			if err != nil {
				return BatchList{}, err
			}
			b.Counts = counts
		}
		b.Runs, b.Matrix, b.Compare = nil, nil, nil
		if b.SubmissionFailures == nil {
			b.SubmissionFailures = []SubmissionFailure{}
		}
	}
	if l.Batches == nil {
		l.Batches = []Batch{}
	}
	return l, nil
}

// CancelBatch cancels every unsettled run of a batch and returns the batch.
func (s *Service) CancelBatch(ctx context.Context, id string) (Batch, error) {
	b, err := s.GetBatch(ctx, id)
	if err != nil {
		return Batch{}, err
	}
	var errs []error
	for _, br := range b.Runs {
		if br.State.Settled() || br.State == "" {
			continue
		}
		if _, err := s.Cancel(ctx, br.RunID); err != nil && !errcode.Is(err, errcode.RunNotFound) {
			errs = append(errs, fmt.Errorf("run %s: %w", br.RunID, err))
		}
	}
	if len(errs) > 0 {
		return Batch{}, errors.Join(errs...)
	}
	return s.GetBatch(ctx, id)
}
