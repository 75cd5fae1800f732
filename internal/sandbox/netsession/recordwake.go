package netsession

// A per-sandbox, in-memory "connection records were written" signal for live watchers
// (watch's connections stream). Nothing is written to the store for it: the flush of the
// records' queue closes the channels of the sandboxes its batch touched.

import "sync"

// recordWake holds, per sandbox someone waits on, a channel closed at the next flush that wrote
// connection records of that sandbox. An entry lives while a waiter holds it.
type recordWake struct {
	mu sync.Mutex
	m  map[string]*wakeEntry
}

type wakeEntry struct {
	ch   chan struct{}
	refs int
}

// wait returns a channel closed when connection records of id are next written, and a
// release the caller must call once it stops waiting on it.
func (w *recordWake) wait(id string) (<-chan struct{}, func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[string]*wakeEntry{}
	}
	e := w.m[id]
	if e == nil {
		e = &wakeEntry{ch: make(chan struct{})}
		w.m[id] = e
	}
	e.refs++
	var once sync.Once
	return e.ch, func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			e.refs--
			if e.refs == 0 && w.m[id] == e {
				delete(w.m, id)
			}
		})
	}
}

// wake closes the channels of ids (each waiter then waits anew).
func (w *recordWake) wake(ids map[string]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id := range ids {
		if e := w.m[id]; e != nil {
			close(e.ch)
			delete(w.m, id)
		}
	}
}

// ConnectionsChanged returns a channel closed when connection records of sandbox id are next
// written to the store, and a release to call when the caller stops waiting (it must, or the
// entry stays). It is a wake-up only: read the records with Connections by cursor.
func (s *Service) ConnectionsChanged(id string) (<-chan struct{}, func()) {
	return s.recWake.wait(id)
}
