package store

import (
	"context"
	"time"
)

// Blob states: a record is written pending before its bytes are (crash-safe: a pending record
// older than a call's deadline, and a file without a record, are swept), then ready.
const (
	BlobPending = "pending"
	BlobReady   = "ready"
)

// Blob sources.
const (
	BlobFromUpload = "upload" // POST /v1/blobs
	BlobFromPull   = "pull"   // remote_pull from Machine's Path
)

// Blob is one file held by the relay (internal/blobs).
type Blob struct {
	ID    string
	Owner string // the API key (or token) that made it: auth.Key.Owner
	State string // BlobPending | BlobReady
	// Name is the file name offered on download (the pulled path's base, or the upload's).
	Name   string
	Size   int64  // bytes held (0 while pending)
	SHA256 string // hex (empty while pending)
	Source string // BlobFromUpload | BlobFromPull
	// Machine and Path say where a pulled blob came from (machine id, absolute path).
	Machine   string
	Path      string
	CreatedAt time.Time
	ExpiresAt time.Time
}

// BlobTransfer is one entry of an owner's transfer ledger: what the relay's quotas count.
type BlobTransfer struct {
	ID    string
	Owner string
	Kind  string // "pull", "push", "upload"
	// Bytes admitted: a pull reserves the per-file maximum and settles to the true size; a push
	// admits none.
	Bytes int64
	At    time.Time
}

// BlobStore is the relay's durable state.
type BlobStore interface {
	// CreateBlob records b (pending, before its bytes are written); CONFLICT if its id exists.
	CreateBlob(ctx context.Context, b Blob) error
	// CompleteBlob marks a pending blob ready with its size and hash; BLOB_NOT_FOUND if it is
	// gone (swept).
	CompleteBlob(ctx context.Context, id string, size int64, sha256 string) error
	// GetBlob returns a blob; BLOB_NOT_FOUND if there is none.
	GetBlob(ctx context.Context, id string) (Blob, error)
	// DeleteBlob removes a blob's record; BLOB_NOT_FOUND if there is none.
	DeleteBlob(ctx context.Context, id string) error
	// ExpiredBlobs returns up to limit blobs (oldest expiry first) that expired at or before
	// now, or that are still pending and were created at or before pendingBefore.
	ExpiredBlobs(ctx context.Context, now, pendingBefore time.Time, limit int) ([]Blob, error)
	// BlobIDs returns up to limit blob ids greater than after, in order (the orphan sweep).
	BlobIDs(ctx context.Context, after string, limit int) ([]string, error)
	// AddBlobTransfer appends t to the ledger.
	AddBlobTransfer(ctx context.Context, t BlobTransfer) error
	// SettleBlobTransfer sets a transfer's admitted bytes (a pull's true size).
	SettleBlobTransfer(ctx context.Context, id string, bytes int64) error
	// BlobTransfers returns up to limit of owner's transfers at or after since, oldest first.
	BlobTransfers(ctx context.Context, owner string, since time.Time, limit int) ([]BlobTransfer, error)
	// PruneBlobTransfers deletes transfers before before; it returns how many.
	PruneBlobTransfers(ctx context.Context, before time.Time) (int, error)
}
