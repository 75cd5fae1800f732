package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/store"
)

const blobColumns = `id, owner, state, name, size, sha256, source, machine, path, created_at, expires_at`

func scanBlob(r rowScanner) (store.Blob, error) {
	var b store.Blob
	var created, expires int64
	err := r.Scan(&b.ID, &b.Owner, &b.State, &b.Name, &b.Size, &b.SHA256, &b.Source, &b.Machine, &b.Path, &created, &expires)
	b.CreatedAt, b.ExpiresAt = fromMillis(created), fromMillis(expires)
	return b, err
}

func blobNotFound(id string) error {
	return errcode.New(errcode.BlobNotFound, "no blob %s (it may have expired: blobs are deleted after their expires_at)", id).With("blob_id", id)
}

// CreateBlob implements store.BlobStore.
func (s *Store) CreateBlob(ctx context.Context, b store.Blob) error {
	_, err := s.write.ExecContext(ctx, `INSERT INTO blobs (`+blobColumns+`) VALUES (?,?,?,?,?,?,?,?,?,?,?)`,
		b.ID, b.Owner, b.State, b.Name, b.Size, b.SHA256, b.Source, b.Machine, b.Path, millis(b.CreatedAt), millis(b.ExpiresAt))
	if isUniqueViolation(err) || isPrimaryKeyViolation(err) {
		return errcode.New(errcode.Conflict, "blob %s already exists", b.ID)
	}
	if err != nil {
		return fmt.Errorf("create blob %s: %w", b.ID, err)
	}
	return nil
}

// CompleteBlob implements store.BlobStore.
func (s *Store) CompleteBlob(ctx context.Context, id string, size int64, sum string) error {
	res, err := s.write.ExecContext(ctx, `UPDATE blobs SET state = ?, size = ?, sha256 = ? WHERE id = ?`, store.BlobReady, size, sum, id)
	if err != nil {
		return fmt.Errorf("complete blob %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return blobNotFound(id)
	}
	return nil
}

// GetBlob implements store.BlobStore.
func (s *Store) GetBlob(ctx context.Context, id string) (store.Blob, error) {
	b, err := scanBlob(s.read.QueryRowContext(ctx, `SELECT `+blobColumns+` FROM blobs WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Blob{}, blobNotFound(id)
	}
	if err != nil {
		return store.Blob{}, fmt.Errorf("get blob %s: %w", id, err)
	}
	return b, nil
}

// DeleteBlob implements store.BlobStore.
func (s *Store) DeleteBlob(ctx context.Context, id string) error {
	res, err := s.write.ExecContext(ctx, `DELETE FROM blobs WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete blob %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return blobNotFound(id)
	}
	return nil
}

// ExpiredBlobs implements store.BlobStore.
func (s *Store) ExpiredBlobs(ctx context.Context, now, pendingBefore time.Time, limit int) ([]store.Blob, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := s.read.QueryContext(ctx, `SELECT `+blobColumns+` FROM blobs
		WHERE expires_at <= ? OR (state = ? AND created_at <= ?) ORDER BY expires_at, id LIMIT ?`,
		millis(now), store.BlobPending, millis(pendingBefore), limit)
	if err != nil {
		return nil, fmt.Errorf("expired blobs: %w", err)
	}
	defer rows.Close()
	var out []store.Blob
	for rows.Next() {
		b, err := scanBlob(rows)
		if err != nil {
			return nil, fmt.Errorf("expired blobs: %w", err)
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// BlobIDs implements store.BlobStore.
func (s *Store) BlobIDs(ctx context.Context, after string, limit int) ([]string, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.read.QueryContext(ctx, `SELECT id FROM blobs WHERE id > ? ORDER BY id LIMIT ?`, after, limit)
	if err != nil {
		return nil, fmt.Errorf("blob ids: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("blob ids: %w", err)
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// AddBlobTransfer implements store.BlobStore.
func (s *Store) AddBlobTransfer(ctx context.Context, t store.BlobTransfer) error {
	_, err := s.write.ExecContext(ctx, `INSERT INTO blob_transfers (id, owner, kind, bytes, at) VALUES (?,?,?,?,?)`,
		t.ID, t.Owner, t.Kind, t.Bytes, millis(t.At))
	if isUniqueViolation(err) || isPrimaryKeyViolation(err) {
		return errcode.New(errcode.Conflict, "transfer %s already exists", t.ID)
	}
	if err != nil {
		return fmt.Errorf("add blob transfer %s: %w", t.ID, err)
	}
	return nil
}

// SettleBlobTransfer implements store.BlobStore.
func (s *Store) SettleBlobTransfer(ctx context.Context, id string, bytes int64) error {
	res, err := s.write.ExecContext(ctx, `UPDATE blob_transfers SET bytes = ? WHERE id = ?`, bytes, id)
	if err != nil {
		return fmt.Errorf("settle blob transfer %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errcode.New(errcode.InvalidArgument, "no transfer %s in the ledger", id)
	}
	return nil
}

// BlobTransfers implements store.BlobStore.
func (s *Store) BlobTransfers(ctx context.Context, owner string, since time.Time, limit int) ([]store.BlobTransfer, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.read.QueryContext(ctx, `SELECT id, owner, kind, bytes, at FROM blob_transfers
		WHERE owner = ? AND at >= ? ORDER BY at, id LIMIT ?`, owner, millis(since), limit)
	if err != nil {
		return nil, fmt.Errorf("blob transfers: %w", err)
	}
	defer rows.Close()
	var out []store.BlobTransfer
	for rows.Next() {
		var t store.BlobTransfer
		var at int64
		if err := rows.Scan(&t.ID, &t.Owner, &t.Kind, &t.Bytes, &at); err != nil {
			return nil, fmt.Errorf("blob transfers: %w", err)
		}
		t.At = fromMillis(at)
		out = append(out, t)
	}
	return out, rows.Err()
}

// PruneBlobTransfers implements store.BlobStore.
func (s *Store) PruneBlobTransfers(ctx context.Context, before time.Time) (int, error) {
	res, err := s.write.ExecContext(ctx, `DELETE FROM blob_transfers WHERE at < ?`, millis(before))
	if err != nil {
		return 0, fmt.Errorf("prune blob transfers: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}
