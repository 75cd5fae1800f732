package image

import (
	"context"
	"sync"
)

// flights runs one function per key at a time for any number of callers (a pull of an image,
// the download of a layer). Unlike x/sync/singleflight, the shared work runs under its own
// context, cancelled only when every caller waiting for it has gone, and its progress is
// reported to each of them. The last caller to leave cancels the work and returns once it has
// ended.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

type flight struct {
	done    chan struct{}
	val     any
	err     error
	waiters int
	cancel  context.CancelFunc
	subs    map[int]ProgressFunc
	next    int
}

func (g *flights) do(ctx context.Context, key string, progress ProgressFunc, fn func(ctx context.Context, report ProgressFunc) (any, error)) (any, error) {
	g.mu.Lock()
	if g.m == nil {
		g.m = map[string]*flight{}
	}
	f := g.m[key]
	if f == nil {
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &flight{done: make(chan struct{}), cancel: cancel, subs: map[int]ProgressFunc{}}
		g.m[key] = f
		report := func(p Progress) {
			g.mu.Lock()
			subs := make([]ProgressFunc, 0, len(f.subs))
			for _, s := range f.subs {
				subs = append(subs, s)
			}
			g.mu.Unlock()
			for _, s := range subs {
				s(p)
			}
		}
		go func() {
			val, err := fn(fctx, report)
			g.mu.Lock()
			f.val, f.err = val, err
			if g.m[key] == f {
				delete(g.m, key)
			}
			g.mu.Unlock()
			cancel()
			close(f.done)
		}()
	}
	f.waiters++
	id := f.next
	f.next++
	if progress != nil {
		f.subs[id] = progress
	}
	g.mu.Unlock()
	select {
	case <-f.done:
		return f.val, f.err
	case <-ctx.Done():
		g.mu.Lock()
		delete(f.subs, id)
		f.waiters--
		last := f.waiters == 0
		if last {
			f.cancel()
			if g.m[key] == f {
				delete(g.m, key)
			}
		}
		g.mu.Unlock()
		if last {
			// The work nobody waits for is cancelled; the last caller returns once it has
			// ended (its temporary files removed), not while it still writes.
			<-f.done
		}
		return nil, ctx.Err()
	}
}
