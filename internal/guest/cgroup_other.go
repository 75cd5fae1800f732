//go:build unix && !linux

package guest

import (
	"errors"
	"syscall"
)

func openCgroup(string) (int, error) { return -1, errors.New("cgroups are Linux's") }

func (s *server) procAttr(attr *syscall.SysProcAttr) *syscall.SysProcAttr { return attr }
