package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Copying disk images for snapshots and forks (copyImage). On a file system with reflinks the
// copy is a clone; on one without (ext4) only the image's data extents are copied (its holes
// stay holes), read through the page cache and written with direct I/O by a few writers at
// once: the copy's blocks go straight to the device (no dirty page cache to write back, which
// both the snapshot's fsync and a fork's loop device (attachLoop's direct I/O flushes it)
// would otherwise wait for), several requests in flight.

const (
	// copyChunk is the unit of work of a copy's writers (and the size of each one's buffer).
	copyChunk = 1 << 20
	// copyWriters is how many chunks of one copy are in flight at once.
	copyWriters = 4
	// directAlign is the alignment direct I/O needs of offsets, lengths and buffers (the
	// logical block size of any device here divides it); a chunk not so aligned is written
	// through the page cache.
	directAlign = 4096
)

// copyImage copies the image src of size bytes to the new file dst (mode 0600): a reflink
// where the file system has them, else src's data extents only. It does not fsync dst: a
// caller that needs the copy durable syncs it (the direct writes still need their metadata
// committed). On failure dst may be left, partly written: the caller removes it.
func copyImage(src, dst string, size int64) error {
	_, err := copyImageDirect(src, dst, size)
	return err
}

// copyImageDirect is copyImage; it also returns how many bytes it wrote with direct I/O.
func copyImageDirect(src, dst string, size int64) (direct int64, err error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return 0, nil
	}
	if err := out.Truncate(size); err != nil {
		return 0, err
	}
	// A second descriptor of the same new file, for direct I/O; a file system without direct
	// I/O gets every chunk through the page cache.
	dfd := -1
	if fd, err := unix.Open(dst, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0); err == nil {
		dfd = fd
		defer unix.Close(fd)
	}
	c := &imageCopy{src: src, dst: dst, in: int(in.Fd()), out: int(out.Fd()), direct: dfd}
	chunks := make(chan [2]int64)
	var wg sync.WaitGroup
	for range copyWriters {
		wg.Go(func() { c.writer(chunks) })
	}
	err = c.extents(size, chunks)
	close(chunks)
	wg.Wait()
	if err != nil {
		return 0, err
	}
	return c.directBytes.Load(), c.failed()
}

// imageCopy is one copyImage between its chunks' writers.
type imageCopy struct {
	src, dst        string
	in, out, direct int // direct is -1 without direct I/O
	mu              sync.Mutex
	err             error
	noDirect        bool // direct I/O was refused once: the rest goes through the page cache
	directBytes     atomic.Int64
}

func (c *imageCopy) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
}

func (c *imageCopy) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// extents sends each data extent of the source, below size, in chunks of at most copyChunk
// bytes ([start, end)), and stops early once a writer has failed. Extents are widened to
// directAlign (what they take in with a hole reads as zeros, so the copy is the same), and
// chunks never overlap: two chunks never share a page, so a chunk written through the page
// cache never meets a direct write in the same page.
func (c *imageCopy) extents(size int64, chunks chan<- [2]int64) error {
	sent := int64(0) // the end of the last chunk sent
	for off := int64(0); off < size; {
		if c.failed() != nil {
			return nil
		}
		data, err := unix.Seek(c.in, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("seek data in %s: %w", c.src, err)
		}
		hole, err := unix.Seek(c.in, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole in %s: %w", c.src, err)
		}
		if hole <= data {
			return fmt.Errorf("seek hole in %s: %d after data at %d", c.src, hole, data)
		}
		hole = min(hole, size)
		off = hole
		data = max(data/directAlign*directAlign, sent)
		hole = min((hole+directAlign-1)/directAlign*directAlign, size)
		for a := data; a < hole; {
			// Chunks end on copyChunk boundaries, so that the middle of a long extent is aligned.
			b := min((a/copyChunk+1)*copyChunk, hole)
			chunks <- [2]int64{a, b}
			a = b
		}
		sent = max(sent, hole)
	}
	return nil
}

// writer copies the chunks it receives until chunks is closed (after a failure it only drains).
func (c *imageCopy) writer(chunks <-chan [2]int64) {
	raw := make([]byte, copyChunk+directAlign)
	pad := (directAlign - int(uintptr(unsafe.Pointer(&raw[0]))%directAlign)) % directAlign
	buf := raw[pad : pad+copyChunk]
	for ch := range chunks {
		if c.failed() != nil {
			continue
		}
		if err := c.copyChunk(buf, ch[0], ch[1]); err != nil {
			c.fail(err)
		}
	}
}

// copyChunk copies [a, b) of the source through buf.
func (c *imageCopy) copyChunk(buf []byte, a, b int64) error {
	p := buf[:b-a]
	for n := 0; n < len(p); {
		m, err := unix.Pread(c.in, p[n:], a+int64(n))
		if err != nil {
			return fmt.Errorf("read %s: %w", c.src, err)
		}
		if m == 0 {
			return fmt.Errorf("read %s: short read at %d", c.src, a+int64(n))
		}
		n += m
	}
	fd := c.out
	aligned := a%directAlign == 0 && len(p)%directAlign == 0
	c.mu.Lock()
	if aligned && c.direct >= 0 && !c.noDirect {
		fd = c.direct
	}
	c.mu.Unlock()
	for n := 0; n < len(p); {
		m, err := unix.Pwrite(fd, p[n:], a+int64(n))
		if errors.Is(err, unix.EINVAL) && fd != c.out {
			// The device wants a larger alignment than directAlign: the page cache, from now on.
			c.mu.Lock()
			c.noDirect = true
			c.mu.Unlock()
			fd = c.out
			continue
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", c.dst, err)
		}
		if m == 0 {
			return fmt.Errorf("write %s: short write at %d", c.dst, a+int64(n))
		}
		if fd != c.out {
			c.directBytes.Add(int64(m))
		}
		n += m
	}
	return nil
}

// forkCopies is how many disks made from snapshots are copied at once on this host (every
// runtime's: they share the device). The copies of a fork are I/O-bound and the container
// starts after them CPU-bound: copied in turn, each at the device's full speed, the first
// sandbox starts while the next disk is copied, where copies all made at once would finish
// together and leave every start to the end.
var forkCopies = make(chan struct{}, forkCopySlots)

// forkCopySlots is forkCopies' size.
const forkCopySlots = 1

// acquireForkCopy waits for a turn to copy a disk from a snapshot and returns what ends it.
func acquireForkCopy(ctx context.Context) (func(), error) {
	select {
	case forkCopies <- struct{}{}:
		return func() { <-forkCopies }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
