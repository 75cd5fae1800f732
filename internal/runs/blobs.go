package runs

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"
)

// blobStore keeps runs' logs and artifacts on the host:
// <root>/<run_id>/{logs/<phase>.<stream>, artifacts/<n>}, directories 0700, every file written
// to a temporary name then renamed.
type blobStore struct {
	root string
	mu   sync.Mutex
}

func newBlobStore(root string) (*blobStore, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("runs: blob store: %w", err)
	}
	return &blobStore{root: root}, nil
}

func (b *blobStore) logPath(runID, phase, stream string) string {
	return filepath.Join(b.root, runID, "logs", phase+"."+stream)
}

func (b *blobStore) artifactPath(runID string, n int) string {
	return filepath.Join(b.root, runID, "artifacts", strconv.Itoa(n))
}

// blobWriter writes one blob to a temporary file; commit renames it into place.
type blobWriter struct {
	f    *os.File
	dst  string
	n    int64
	hash []byte
	sum  interface {
		io.Writer
		Sum([]byte) []byte
	}
}

func (b *blobStore) create(dst string) (*blobWriter, error) {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Dir(dst), ".tmp-*")
	if err != nil {
		return nil, err
	}
	return &blobWriter{f: f, dst: dst, sum: sha256.New()}, nil
}

func (w *blobWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.n += int64(n)
	w.sum.Write(p[:n])
	return n, err
}

func (w *blobWriter) sha() string { return hex.EncodeToString(w.sum.Sum(nil)) }

func (w *blobWriter) commit() error {
	if err := w.f.Close(); err != nil {
		os.Remove(w.f.Name())
		return err
	}
	return os.Rename(w.f.Name(), w.dst)
}

func (w *blobWriter) abort() {
	w.f.Close()
	os.Remove(w.f.Name())
}

// readLog reads up to max bytes of a phase's stream from off; total is the kept size.
func (b *blobStore) readLog(runID, phase, stream string, off, max int64) ([]byte, int64, error) {
	f, err := os.Open(b.logPath(runID, phase, stream))
	if err != nil {
		return nil, 0, err // fs.ErrNotExist: never written or removed; the caller says which
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	total := st.Size()
	if off >= total {
		return []byte{}, total, nil
	}
	buf := make([]byte, min(max, total-off))
	n, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, 0, err
	}
	return buf[:n], total, nil
}

func (b *blobStore) openArtifact(runID string, n int) (*os.File, error) {
	return os.Open(b.artifactPath(runID, n))
}

// remove deletes a run's blobs.
func (b *blobStore) remove(runID string) error {
	if !runIDPattern.MatchString(runID) {
		return nil
	}
	return os.RemoveAll(filepath.Join(b.root, runID))
}

// runSize returns the bytes a run's blobs hold and their newest modification time.
func (b *blobStore) usage() (map[string]int64, map[string]time.Time, int64) {
	sizes, times := map[string]int64{}, map[string]time.Time{}
	var total int64
	ents, _ := os.ReadDir(b.root)
	for _, e := range ents {
		if !e.IsDir() || !runIDPattern.MatchString(e.Name()) {
			continue
		}
		id := e.Name()
		filepath.WalkDir(filepath.Join(b.root, id), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			if info, err := d.Info(); err == nil {
				sizes[id] += info.Size()
				total += info.Size()
				if info.ModTime().After(times[id]) {
					times[id] = info.ModTime()
				}
			}
			return nil
		})
	}
	return sizes, times, total
}

// gcOverBudget removes the blobs of settled runs (settled reports which), oldest first, until
// the store holds at most budget bytes; it returns the runs whose blobs went.
func (b *blobStore) gcOverBudget(budget int64, settled func(string) bool) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	sizes, times, total := b.usage()
	if total <= budget {
		return nil
	}
	ids := make([]string, 0, len(sizes))
	for id := range sizes {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return times[ids[i]].Before(times[ids[j]]) })
	var gone []string
	for _, id := range ids {
		if total <= budget {
			break
		}
		if !settled(id) {
			continue
		}
		if b.remove(id) == nil {
			total -= sizes[id]
			gone = append(gone, id)
		}
	}
	return gone
}
