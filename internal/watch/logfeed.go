package watch

import (
	"context"
	"time"

	"sync"
)

// A logFeed follows one job's log for every logs stream of that job: one long-polling read of
// the log outstanding at a time (JobLogPager with LogLongPoll), whose answer — the bytes the job
// just wrote, or its end — it publishes to the streams at once. A stream sends a published
// chunk from its own offset; one behind the chunk (it was slow, or started after it) or told of
// a failed read reads the log itself, so the feed is a shared wake and cache, never the only
// path to the bytes, and a slow stream never slows it.
type logFeed struct {
	key    feedKey
	refs   int // under Hub.feedMu
	cancel context.CancelFunc

	mu      sync.Mutex
	chunk   JobLogChunk // the last chunk with output, or the job's end
	have    bool
	err     error         // the last read's error (cleared by the next good one)
	changed chan struct{} // closed, and replaced, at each publish
}

type feedKey struct{ sandboxID, jobID string }

// wake returns a channel closed at the feed's next publish. Taken before latest, it misses none.
func (f *logFeed) wake() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

func (f *logFeed) latest() (JobLogChunk, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.chunk, f.have, f.err
}

func (f *logFeed) publish(c JobLogChunk, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		f.chunk, f.have = c, true
	}
	f.err = err
	close(f.changed)
	f.changed = make(chan struct{})
}

// acquireFeed returns the feed of the job, started at offset if it is new; releaseFeed ends
// it with its last stream.
func (h *Hub) acquireFeed(sandboxID, jobID string, offset int64) *logFeed {
	k := feedKey{sandboxID, jobID}
	h.feedMu.Lock()
	defer h.feedMu.Unlock()
	if f := h.feeds[k]; f != nil {
		f.refs++
		return f
	}
	ctx, cancel := context.WithCancel(h.ctx)
	f := &logFeed{key: k, refs: 1, cancel: cancel, changed: make(chan struct{})}
	h.feeds[k] = f
	h.feedWG.Add(1)
	go func() {
		defer h.feedWG.Done()
		h.followLog(ctx, f, offset)
	}()
	return f
}

func (h *Hub) releaseFeed(f *logFeed) {
	h.feedMu.Lock()
	defer h.feedMu.Unlock()
	if f.refs--; f.refs == 0 {
		delete(h.feeds, f.key)
		f.cancel()
	}
}

// LogFeeds returns how many jobs' logs the hub follows (one outstanding read each).
func (h *Hub) LogFeeds() int {
	h.feedMu.Lock()
	defer h.feedMu.Unlock()
	return len(h.feeds)
}

// followLog reads the job's log from offset, one long poll at a time, publishing each chunk
// of output and the job's end, until the job ended or the feed's last stream went. A read that
// came back empty before its wait (the source cannot wait) is spaced to one per LogPoll; a
// failed one is published (its streams read for themselves, and end on the error as a read of
// their own would) and retried after a backoff.
func (h *Hub) followLog(ctx context.Context, f *logFeed, off int64) {
	backoff := time.Second
	for ctx.Err() == nil {
		t0 := time.Now()
		rctx, cancel := context.WithTimeout(ctx, LogLongPoll+30*time.Second)
		c, err := h.opts.JobLogs(rctx, f.key.sandboxID, f.key.jobID, off, MaxLogChunk, LogLongPoll)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			f.publish(JobLogChunk{}, err)
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, 10*time.Second)
			continue
		}
		backoff = time.Second
		ended := !c.Running && c.NextOffset >= c.TotalBytes
		if len(c.Data) > 0 || ended {
			f.publish(c, nil)
		}
		if ended {
			return
		}
		off = c.NextOffset
		if len(c.Data) == 0 {
			if el := time.Since(t0); el < LogLongPoll && !sleepCtx(ctx, h.opts.LogPoll-el) {
				return
			}
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// fromFeed delivers what the job's feed published last: from the watcher's offset when the
// chunk holds it, by a read of its own when the watcher is behind the chunk or the feed's read
// failed. It ends the stream when the job ended and its whole log was delivered.
func (w *watcher) fromFeed(ctx context.Context) error {
	w.feedWake = w.feed.wake() // before latest: a publish after it wakes the next round
	c, have, err := w.feed.latest()
	if err != nil || (have && w.logOffset < c.Offset) {
		return w.poll(ctx)
	}
	if !have || w.logDone {
		return nil
	}
	if w.logOffset < c.NextOffset {
		data := c.Data[w.logOffset-c.Offset:]
		if err := w.send(Message{Kind: KindLogs, JobID: w.req.JobID, Data: data, Offset: w.logOffset, State: w.state}); err != nil {
			return err
		}
		w.logOffset = c.NextOffset
	}
	if !c.Running && w.logOffset >= c.TotalBytes {
		w.logDone = true
		return w.end(EndJob)
	}
	return nil
}
