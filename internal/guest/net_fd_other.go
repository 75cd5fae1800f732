//go:build !linux

package guest

import (
	"bufio"
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

func dupCloexec(int) (int, error) { return -1, errors.New("listeners are handed over on Linux only") }

func readReplyWithRights(uc *net.UnixConn, max int) (line, rest []byte, fds []int, err error) {
	line, err = readLineMax(bufio.NewReaderSize(uc, 1), max)
	return line, nil, nil, err
}
