package microvm

import (
	"fmt"
	"io"
)

// cpioWriter writes the "newc" cpio format the kernel unpacks an initramfs from.
type cpioWriter struct {
	w   io.Writer
	ino int
	n   int64
	err error
}

func (c *cpioWriter) write(p []byte) {
	if c.err != nil {
		return
	}
	var k int
	k, c.err = c.w.Write(p)
	c.n += int64(k)
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// entry writes one file, directory or symlink: mode holds the type bits (0o040000 directory,
// 0o100000 regular file, 0o120000 symlink) and the permissions; data is the content (a
// symlink's target).
func (c *cpioWriter) entry(name string, mode uint32, data []byte) {
	c.ino++
	nlink := 1
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write(append([]byte(name), 0))
	c.pad()
	c.write(data)
	c.pad()
}

// close writes the trailer.
func (c *cpioWriter) close() error {
	c.entry("TRAILER!!!", 0, nil)
	return c.err
}
