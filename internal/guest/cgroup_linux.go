package guest

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// openCgroup opens cgroup directory dir for CLONE_INTO_CGROUP.
func openCgroup(dir string) (int, error) {
	return unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// procAttr is attr with the commands' cgroup (ServerConfig.CommandCgroup), where there is one.
func (s *server) procAttr(attr *syscall.SysProcAttr) *syscall.SysProcAttr {
	if s.cgroupFD >= 0 {
		attr.UseCgroupFD, attr.CgroupFD = true, s.cgroupFD
	}
	return attr
}
