//go:build !linux

package guest

import (
	"errors"
	"net"
)

func readFirstWithRights(uc *net.UnixConn, p []byte) ([]int, error) {
	if _, err := uc.Read(p); err != nil {
		return nil, errNoFrame
	}
	return nil, nil
}

func takeSocket(fd int, h NetStreamHeader) (*net.TCPConn, error) {
	return nil, errors.New("handed-over sockets are taken on Linux only")
}

func takeListenerFD(fd int, h NetStreamHeader) (*net.TCPListener, error) {
	return nil, errors.New("handed-over listeners are taken on Linux only")
}

func closeFD(int) {}

func isPlainTCP(int) bool { return false }
