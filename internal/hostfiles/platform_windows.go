//go:build windows

package hostfiles

import (
	"io/fs"
	"os"

	"golang.org/x/sys/windows"
)

// owner is unused on Windows: a replaced file's ACL is not copied (the new file inherits its
// directory's).
type owner struct{}

func ownerOf(fs.FileInfo) owner { return owner{} }

func setOwner(*os.File, owner) string { return "" }

func openRead(p string) (*os.File, error) { return os.Open(p) }

// freeBytes is the space on dir's volume available to the agent's user (GetDiskFreeSpaceEx).
func freeBytes(dir string) (uint64, error) {
	p, err := windows.UTF16PtrFromString(dir)
	if err != nil {
		return 0, err
	}
	var avail, total, free uint64
	if err := windows.GetDiskFreeSpaceEx(p, &avail, &total, &free); err != nil {
		return 0, err
	}
	return avail, nil
}

func syncDir(string) {}
