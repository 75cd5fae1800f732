package sandbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/text"
)

// bus wakes subscribers when the store gains events. It carries no events itself: a subscriber
// reads them from the store by cursor, so a slow one never loses any and none is queued in memory.
type bus struct {
	mu sync.Mutex
	ch chan struct{} // closed, and replaced, on every publish
}

func newBus() *bus { return &bus{ch: make(chan struct{})} }

// changed returns a channel closed at the next publish.
func (b *bus) changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *bus) publish() {
	b.mu.Lock()
	close(b.ch)
	b.ch = make(chan struct{})
	b.mu.Unlock()
}

// subscribeRecheck bounds how long a subscriber waits without looking at the store: events that
// another process appended to a shared database do not publish on this process's bus.
const subscribeRecheck = 2 * time.Second

// Subscribe delivers every event with a sequence number above after, in order, as the store
// records them, until ctx ends (then the channel closes). It reads the store by cursor, so a
// subscriber that falls behind catches up and never misses an event; the channel's small buffer
// is the only memory a subscriber holds.
func (s *Service) Subscribe(ctx context.Context, after int64) (<-chan Event, error) {
	if after < 0 {
		return nil, errcode.New(errcode.InvalidArgument, "after must not be negative; got %d", after)
	}
	out := make(chan Event, 64)
	go func() {
		defer close(out)
		cursor := after
		for {
			changed := s.bus.changed() // before reading, so a publish in between is not missed
			evs, err := s.store.ListEvents(ctx, EventFilter{AfterSeq: cursor, Limit: MaxList})
			if err != nil && ctx.Err() == nil {
				s.log.Warn("event subscription: read events", "err", err)
			}
			for _, ev := range evs {
				select {
				case out <- ev:
					cursor = ev.Seq
				case <-ctx.Done():
					return
				}
			}
			if len(evs) == MaxList {
				continue
			}
			t := time.NewTimer(subscribeRecheck)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-changed:
			case <-t.C:
			}
			t.Stop()
		}
	}()
	return out, nil
}

// StoreChanged wakes the service's event subscribers to reread the store now: another replica
// recorded something (FollowChanges calls it on the store's change notifications).
func (s *Service) StoreChanged() { s.bus.publish() }

// ChangeNotifier is the optional part of a Store that tells of changes other processes made
// (Postgres LISTEN/NOTIFY): the channel receives (coalesced) after each, and closes when ctx
// ends or the notifier fails; a watcher then rereads what it watches.
type ChangeNotifier interface {
	Changes(ctx context.Context) (<-chan struct{}, error)
}

// FollowChanges calls every wake function on each change notification of cn until ctx ends, so
// a watcher on this replica sees another replica's changes within milliseconds rather than at
// its next periodic recheck. When the notifier fails it wakes them once (a change may have gone
// unseen) and listens again after a backoff (1 s, doubling, at most 30 s).
func FollowChanges(ctx context.Context, cn ChangeNotifier, log *slog.Logger, wake ...func()) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	all := func() {
		for _, w := range wake {
			w()
		}
	}
	backoff := time.Second
	for ctx.Err() == nil {
		ch, err := cn.Changes(ctx)
		if err == nil {
			for range ch {
				backoff = time.Second // a notifier that delivers is healthy again
				all()
			}
		}
		if ctx.Err() != nil {
			return
		}
		all()
		log.Warn("store change notifications interrupted; watchers fall back to rereading periodically until they resume", "err", err, "retry_in", backoff)
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// sandboxEvent appends an event of typ to sandbox id's record (the caller holds its lock); a
// failure is logged, not returned.
func (s *Service) sandboxEvent(ctx context.Context, id, typ, reason string) {
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		s.log.Warn("record event", "sandbox_id", id, "type", typ, "err", err)
		return
	}
	sb.Version++
	sb.UpdatedAt = s.now().UTC().Truncate(time.Millisecond)
	ev := Event{SandboxID: id, Type: typ, From: sb.State, To: sb.State, At: sb.UpdatedAt, Reason: text.Truncate(reason, 1024)}
	if err := s.store.UpdateSandbox(ctx, sb, ev); err != nil {
		s.log.Warn("record event", "sandbox_id", id, "type", typ, "err", err)
		return
	}
	s.bus.publish()
}
