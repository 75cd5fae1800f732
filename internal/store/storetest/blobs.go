package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/store"
)

// blobTests cover the file relay's records and quota ledger.
var blobTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"BlobLifecycle", testBlobLifecycle},
	{"BlobExpiredAndPending", testBlobExpiredAndPending},
	{"BlobIDsPaging", testBlobIDsPaging},
	{"BlobTransferLedger", testBlobTransferLedger},
}

func testBlobLifecycle(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Date(2026, 12, 3, 1, 2, 3, 4_000_000, zone())
	b := store.Blob{ID: "blob-1", Owner: "key:k1", State: store.BlobPending, Name: "model.bin", Source: store.BlobFromPull,
		Machine: "m-1", Path: "/data/model.bin", CreatedAt: now, ExpiresAt: now.Add(24 * time.Hour)}
	if err := s.CreateBlob(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateBlob(ctx, b); !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("CreateBlob twice = %v, want CONFLICT", err)
	}
	got, err := s.GetBlob(ctx, "blob-1")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != store.BlobPending || got.Owner != b.Owner || got.Name != b.Name || got.Source != b.Source ||
		got.Machine != b.Machine || got.Path != b.Path || !got.CreatedAt.Equal(now) || !got.ExpiresAt.Equal(b.ExpiresAt) ||
		got.CreatedAt.Location() != time.UTC {
		t.Fatalf("GetBlob = %+v, want %+v (times in UTC)", got, b)
	}
	if err := s.CompleteBlob(ctx, "blob-1", 1234, "abcd"); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetBlob(ctx, "blob-1")
	if got.State != store.BlobReady || got.Size != 1234 || got.SHA256 != "abcd" {
		t.Fatalf("completed = %+v", got)
	}
	if err := s.DeleteBlob(ctx, "blob-1"); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"get":      func() error { _, err := s.GetBlob(ctx, "blob-1"); return err }(),
		"delete":   s.DeleteBlob(ctx, "blob-1"),
		"complete": s.CompleteBlob(ctx, "blob-1", 1, "x"),
	} {
		if !errcode.Is(err, errcode.BlobNotFound) {
			t.Errorf("%s of a deleted blob = %v, want BLOB_NOT_FOUND", name, err)
		}
	}
}

func testBlobExpiredAndPending(t *testing.T, s store.Store) {
	ctx := context.Background()
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	mk := func(id, state string, created time.Time, ttl time.Duration) {
		t.Helper()
		if err := s.CreateBlob(ctx, store.Blob{ID: id, Owner: "o", State: state, Source: store.BlobFromUpload, CreatedAt: created, ExpiresAt: created.Add(ttl)}); err != nil {
			t.Fatal(err)
		}
	}
	mk("b-old", store.BlobReady, t0, time.Hour)                            // expires t0+1h
	mk("b-new", store.BlobReady, t0.Add(2*time.Hour), time.Hour)           // expires t0+3h
	mk("b-stale", store.BlobPending, t0.Add(30*time.Minute), 24*time.Hour) // pending since t0+30m
	mk("b-fresh", store.BlobPending, t0.Add(2*time.Hour), 24*time.Hour)    // pending since t0+2h
	ids := func(bs []store.Blob) string {
		var s string
		for _, b := range bs {
			s += b.ID + " "
		}
		return s
	}
	got, err := s.ExpiredBlobs(ctx, t0.Add(time.Hour), t0.Add(time.Hour), 10)
	if err != nil {
		t.Fatal(err)
	}
	if ids(got) != "b-old b-stale " {
		t.Fatalf("expired at t0+1h = %q, want b-old (expired) and b-stale (pending too long)", ids(got))
	}
	if got, _ := s.ExpiredBlobs(ctx, t0.Add(time.Hour-time.Millisecond), t0, 10); len(got) != 0 {
		t.Fatalf("just before expiry = %q, want none", ids(got))
	}
	if got, _ := s.ExpiredBlobs(ctx, t0.Add(4*time.Hour), t0.Add(4*time.Hour), 1); len(got) != 1 {
		t.Fatalf("limit 1 gave %d", len(got))
	}
}

func testBlobIDsPaging(t *testing.T, s store.Store) {
	ctx := context.Background()
	for i := range 5 {
		if err := s.CreateBlob(ctx, store.Blob{ID: fmt.Sprintf("blob-%d", i), Owner: "o", State: store.BlobReady, CreatedAt: time.Now(), ExpiresAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	var all []string
	after := ""
	for {
		page, err := s.BlobIDs(ctx, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		if len(page) > 2 {
			t.Fatalf("page of %d, limit 2", len(page))
		}
		all = append(all, page...)
		after = page[len(page)-1]
	}
	if fmt.Sprint(all) != "[blob-0 blob-1 blob-2 blob-3 blob-4]" {
		t.Fatalf("paged ids = %v", all)
	}
}

func testBlobTransferLedger(t *testing.T, s store.Store) {
	ctx := context.Background()
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	add := func(id, owner string, bytes int64, at time.Time) {
		t.Helper()
		if err := s.AddBlobTransfer(ctx, store.BlobTransfer{ID: id, Owner: owner, Kind: "pull", Bytes: bytes, At: at}); err != nil {
			t.Fatal(err)
		}
	}
	add("t2", "a", 200, t0.Add(2*time.Minute))
	add("t1", "a", 100, t0.Add(time.Minute))
	add("t3", "a", 300, t0.Add(3*time.Minute))
	add("tb", "b", 999, t0.Add(2*time.Minute))
	if err := s.AddBlobTransfer(ctx, store.BlobTransfer{ID: "t1", Owner: "a", At: t0}); !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("duplicate transfer = %v, want CONFLICT", err)
	}
	got, err := s.BlobTransfers(ctx, "a", t0.Add(2*time.Minute), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != "t2" || got[1].ID != "t3" || got[0].Bytes != 200 || !got[0].At.Equal(t0.Add(2*time.Minute)) || got[0].Kind != "pull" {
		t.Fatalf("a's transfers since t0+2m = %+v, want t2, t3 (oldest first, b's not among them)", got)
	}
	if err := s.SettleBlobTransfer(ctx, "t2", 7); err != nil {
		t.Fatal(err)
	}
	if err := s.SettleBlobTransfer(ctx, "nope", 7); err == nil {
		t.Fatal("settling an unknown transfer succeeded")
	}
	got, _ = s.BlobTransfers(ctx, "a", t0, 1)
	if len(got) != 1 || got[0].ID != "t1" {
		t.Fatalf("limit 1 = %+v", got)
	}
	got, _ = s.BlobTransfers(ctx, "a", t0, 10)
	if got[1].Bytes != 7 {
		t.Fatalf("settled bytes = %d, want 7", got[1].Bytes)
	}
	n, err := s.PruneBlobTransfers(ctx, t0.Add(2*time.Minute))
	if err != nil || n != 1 {
		t.Fatalf("prune = %d, %v; want 1 (t1)", n, err)
	}
	if got, _ := s.BlobTransfers(ctx, "b", t0, 10); len(got) != 1 {
		t.Fatalf("b's transfers after prune = %+v", got)
	}
}
