package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentbox/agentbox/internal/store"
)

var _ store.ChangeNotifier = (*Store)(nil)

// Reconnect backoff of Changes' connection.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// Changes LISTENs on Channel over a connection of its own (store.ChangeNotifier): the channel
// it returns receives after each committed write transaction that appended sandbox or run
// events, by this or any other process on the database (coalesced: one pending wake at most),
// and after a reconnect. It is closed when ctx ends.
func (s *Store) Changes(ctx context.Context) (<-chan struct{}, error) {
	conn, err := s.listen(ctx)
	if err != nil {
		return nil, fmt.Errorf("postgres: %s: listen for changes: %w", s.where, err)
	}
	ch := make(chan struct{}, 1)
	wake := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	go func() {
		defer close(ch)
		backoff := minBackoff
		for {
			if conn != nil {
				_, err := conn.WaitForNotification(ctx)
				if err == nil {
					backoff = minBackoff
					wake()
					continue
				}
				closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
				_ = conn.Close(closeCtx)
				cancel()
				conn = nil
			}
			if ctx.Err() != nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, maxBackoff)
			if c, err := s.listen(ctx); err == nil {
				conn = c
				wake() // notifications sent while disconnected are lost: look again
			}
		}
	}()
	return ch, nil
}

// listen opens a connection that LISTENs on Channel.
func (s *Store) listen(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, s.cfg.Copy())
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{Channel}.Sanitize()); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}
