package sandbox

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

// IDRange is the block of host user and group ids one sandbox's user namespace maps to: id 0
// inside the sandbox (its root) is Base on the host, id 1000 (the agent user) is Base+1000, and
// so on up to Count-1. The control plane allocates one per sandbox from its pool when it admits
// the sandbox and records it in the store, so no two sandboxes, and no user of the host, ever
// share an id; it frees the range once the sandbox's host resources are gone.
type IDRange struct {
	SandboxID   string    `json:"sandbox_id"`
	Base        int64     `json:"base"`
	Count       int64     `json:"count"`
	AllocatedAt time.Time `json:"allocated_at"`
}

// End is the first id past the range.
func (r IDRange) End() int64 { return r.Base + r.Count }

// Overlaps reports whether r and o share an id.
func (r IDRange) Overlaps(o IDRange) bool { return r.Base < o.End() && o.Base < r.End() }

// Contains reports whether host id lies in r.
func (r IDRange) Contains(id int64) bool { return id >= r.Base && id < r.End() }

// MaxHostID bounds every range: uid_t is 32 bits and (uid_t)-1 means "no id".
const MaxHostID = 1<<32 - 1

// ValidateIDRange checks what a store must refuse to record.
func ValidateIDRange(r IDRange) error {
	switch {
	case r.SandboxID == "":
		return errcode.New(errcode.InvalidArgument, "an id range needs the id of the sandbox holding it")
	case r.Count <= 0:
		return errcode.New(errcode.InvalidArgument, "id range of %s: count must be positive, got %d", r.SandboxID, r.Count)
	case r.Base < 0 || r.End() > MaxHostID:
		return errcode.New(errcode.InvalidArgument, "id range of %s: [%d, %d) is outside the host's ids [0, %d)", r.SandboxID, r.Base, r.End(), int64(MaxHostID))
	}
	return nil
}

// IDPool is where the control plane takes sandboxes' id ranges from: Ranges blocks of Size ids
// starting at Base, skipping every block that overlaps Reserved (the host's own users and the
// ranges /etc/subuid and /etc/subgid delegate) or the first 65536 ids.
type IDPool struct {
	Base     int64
	Size     int64
	Ranges   int
	Reserved []IDRange
}

// Pool defaults: 65536 ids per sandbox (the whole 16-bit id space inside, so root, the agent
// user 1000 and nobody 65534 all exist), starting at 200000, clear of the ids most hosts use.
const (
	DefaultIDPoolBase = 200000
	IDRangeSize       = 65536
	// minPoolBase keeps every range clear of 0-65535, where hosts put their own users.
	minPoolBase = 65536
)

// bases returns the first id of every block of the pool, lowest first.
func (p IDPool) bases() ([]int64, error) {
	if p.Size <= 0 || p.Ranges <= 0 {
		return nil, fmt.Errorf("id pool: size %d and ranges %d must be positive", p.Size, p.Ranges)
	}
	out := make([]int64, 0, p.Ranges)
	for b := max(p.Base, minPoolBase); len(out) < p.Ranges; b += p.Size {
		if b+p.Size > MaxHostID {
			return nil, fmt.Errorf("id pool: only %d blocks of %d ids fit between %d and %d clear of reserved ids; %d are needed (lower the pool's base or the maximum number of sandboxes)",
				len(out), p.Size, p.Base, int64(MaxHostID), p.Ranges)
		}
		cand := IDRange{Base: b, Count: p.Size}
		clear := true
		for _, r := range p.Reserved {
			if cand.Overlaps(r) {
				clear = false
				break
			}
		}
		if clear {
			out = append(out, b)
		}
	}
	return out, nil
}

// freeIDBase returns the lowest base of the pool that no held range overlaps. allocateIDRange
// holds idMu, so no other create of this server takes it meanwhile; the store refuses an
// overlap anyway.
func (s *Service) freeIDBase(ctx context.Context) (int64, error) {
	held, err := s.store.ListIDRanges(ctx)
	if err != nil {
		return 0, fmt.Errorf("list id ranges: %w", err)
	}
	for _, b := range s.local.idBases {
		if slices.ContainsFunc(held, IDRange{Base: b, Count: IDRangeSize}.Overlaps) {
			continue
		}
		if c := s.cfg.IDClaims; c != nil { // the record's first act: the host-wide claim
			ok, err := c.Claim(b, IDRangeSize)
			if err != nil {
				return 0, fmt.Errorf("claim host ids [%d, %d): %w", b, b+IDRangeSize, err)
			}
			if !ok {
				continue // another server on this host holds it
			}
		}
		return b, nil
	}
	return 0, errcode.New(errcode.CapacityUnavailable, "all %d host id ranges for sandboxes are held (the sweep frees those of sandboxes that are no longer live within a minute); destroy sandboxes you no longer need, or retry shortly",
		len(s.local.idBases)).With("id_ranges", len(s.local.idBases))
}

// IDClaimer is the host-wide claims on id ranges (internal/idclaim.Claims).
type IDClaimer interface {
	// Claim claims [base, base+count) for this server: false when another server holds it.
	Claim(base, count int64) (bool, error)
	// Sync makes this server's claims the ranges held (base → count), claiming each; it
	// returns those another server's claims overlap.
	Sync(held map[int64]int64) (conflicts []string, err error)
}

// syncIDClaims makes the host-wide claims this server's held ranges (a crash between a claim and
// its record, a released range: dropped; an installation from before the claims: adopted).
func (s *Service) syncIDClaims(held []IDRange) error {
	if s.cfg.IDClaims == nil {
		return nil
	}
	m := make(map[int64]int64, len(held))
	for _, r := range held {
		m[r.Base] = r.Count
	}
	conflicts, err := s.cfg.IDClaims.Sync(m)
	for _, c := range conflicts {
		s.log.Error("a sandbox's host id range is claimed by another agentbox server on this host too: their sandboxes share host ids until one is destroyed", "range", c)
	}
	return err
}

// releaseIDRange frees sandbox id's range once its host resources are gone. A failure only
// delays the release to the next sweep, so it is logged, not returned.
func (s *Service) releaseIDRange(ctx context.Context, id string) {
	if err := s.store.ReleaseIDRange(ctx, id); err != nil {
		s.log.Warn("free id range (the sweep will retry)", "sandbox_id", id, "err", err)
	}
}

// sweepIDRanges frees every held id range whose sandbox owned does not claim: a sandbox that
// is gone, or no longer live (its host resources, processes included, deleted by the sweep
// just before, or already by destroy).
func (s *Service) sweepIDRanges(ctx context.Context, owned func(id string) bool) error {
	held, err := s.store.ListIDRanges(ctx)
	if err != nil {
		return fmt.Errorf("list id ranges: %w", err)
	}
	for _, r := range held {
		if owned(r.SandboxID) {
			continue
		}
		unlock := s.lock(r.SandboxID)
		s.log.Warn("freeing the host id range of a sandbox that is gone", "sandbox_id", r.SandboxID, "base", r.Base, "count", r.Count)
		err := s.store.ReleaseIDRange(ctx, r.SandboxID)
		unlock()
		if err != nil {
			return fmt.Errorf("free id range of %s: %w", r.SandboxID, err)
		}
	}
	if s.cfg.IDClaims == nil {
		return nil
	}
	s.idMu.Lock() // no create claims meanwhile: its claim would be dropped before its record
	defer s.idMu.Unlock()
	if held, err = s.store.ListIDRanges(ctx); err != nil {
		return fmt.Errorf("list id ranges: %w", err)
	}
	if err := s.syncIDClaims(held); err != nil {
		return fmt.Errorf("sync host id claims: %w", err)
	}
	return nil
}

// IDRanges returns the host id ranges sandboxes hold, lowest first.
func (s *Service) IDRanges(ctx context.Context) ([]IDRange, error) {
	return s.store.ListIDRanges(ctx)
}
